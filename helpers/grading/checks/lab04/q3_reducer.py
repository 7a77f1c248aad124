"""Checks of lab 4.3: the Reducer launches every bucket during backward and finalize() waits for them."""
import itertools
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F

from helpers.comm import CommLedger
from helpers.grading.checks.lab04.common import (
    CAP_BYTES,
    CAP_MB,
    MLP_BUCKETS,
    SLOW_RANK_S,
    TOL,
    diagnose,
    flat,
    local_grads,
    make_model,
    max_diff,
    rank_batch,
    run_on_ranks,
)
from helpers.grading.registry import answer, public_check


# ------------------------------------------------------------------------------------------------ question 4.3
def _on_ranks_reducer(Reducer, steps, slow_rank_s, offset=0):
    """A Reducer on the MLP (different initial weights per rank); per step: calls, starts vs backward, gradients."""
    rank, n = dist.get_rank(), dist.get_world_size()
    model = make_model(100 + rank + 10 * offset)
    reducer = Reducer(model, CAP_MB)  # broadcasts rank 0's parameters (given code)
    report = []
    for step in range(steps):
        model.zero_grad(set_to_none=True)
        x, y = rank_batch(step, rank, offset)
        with CommLedger() as ledger:
            loss = F.mse_loss(model(x), y)
            if slow_rank_s and rank == n - 1:
                time.sleep(slow_rank_s)
            loss.backward()
            backward_end = time.perf_counter()
            reducer.finalize()
            # An all-reduce whose end is not stamped yet had not finished when finalize() returned.
            unfinished = sum(r.end is None for r in ledger.records if r.op == "all_reduce")
        starts = [r.start for r in ledger.records if r.op == "all_reduce"]
        report.append({"calls": len(starts), "during_backward": sum(s < backward_end for s in starts),
                       "others": sorted({r.op for r in ledger.records} - {"all_reduce"}), "unfinished": unfinished,
                       "grads": [p.grad.clone() if p.grad is not None else None for p in model.parameters()]})
    return report


def _check_reducer_report(report, world_size, ranks_to_check, offset=0):
    model = make_model(100 + 10 * offset)  # rank 0's weights, which the Reducer broadcast
    n_buckets = len(MLP_BUCKETS)
    params = flat([p.detach() for p in model.parameters()])
    where = f"world size {world_size}, the lab MLP with bucket_cap_mb = {CAP_BYTES} B / 2**20 ({n_buckets} buckets)"
    for rank in ranks_to_check:
        for step, r in enumerate(report[rank]):
            at = f"{where}, rank {rank}, step {step + 1}"
            assert not r["others"], f"{at}: during the step the Reducer also issued {r['others']}; only all-reduces"
            missing = [i for i, g in enumerate(r["grads"]) if g is None]
            assert not missing, f"{at}: p.grad is None for parameters {missing} after finalize()"
            per_param = [local_grads(model, step, q, offset) for q in range(world_size)]
            local = [flat(grads) for grads in per_param]
            mean = sum(local) / world_size
            got = flat(r["grads"])
            error = max_diff(got, mean)
            hint = diagnose(got, mean, local[rank], params, world_size) or _stale_buckets(r["grads"], per_param, rank)
            if not hint and r["unfinished"]:
                hint = (f" finalize() returned before {r['unfinished']} all-reduce(s) had finished: wait() on the work "
                        "handle of every bucket before copying its buffer back.")
            assert error <= TOL, (
                f"{at}: after finalize(), max |p.grad - mean over ranks of the gradients| = {error:.2e} "
                f"(tolerance {TOL:.0e}).{hint} "
                f"({r['calls']} all-reduces in the step, {n_buckets} expected.)")
            if r["calls"] > n_buckets:
                raise AssertionError(f"{at}: {r['calls']} all-reduces in one step, expected {n_buckets}, one per "
                                     "bucket: too many messages (one per parameter, or a bucket launched twice?)")
            assert r["calls"] == n_buckets, (
                f"{at}: {r['calls']} all-reduces in one step, expected {n_buckets} (one per bucket)"
                + (": did finish() reset pending for the next step?" if step else ""))
            assert r["during_backward"] == n_buckets, (
                f"{at}: only {r['during_backward']} of the {n_buckets} all-reduces started before backward() returned: "
                "launch each bucket from the gradient hooks, during backward, not in finalize()")


def _stale_buckets(grads, per_param, rank):
    """The hint for a finalize() that copied some buckets back before their all-reduce finished (the others had):
    those parameters hold this rank's own gradient divided by the world size, the rest the mean."""
    n = len(per_param)
    mean = [sum(grads_q[i] for grads_q in per_param) / n for i in range(len(grads))]
    stale = [i for i, g in enumerate(grads)
             if max_diff(g, per_param[rank][i] / n) <= TOL < max_diff(g, mean[i])]
    if stale:
        return (f" Parameters {stale} equal this rank's own gradient divided by the world size: their all-reduce had "
                "not finished when their bucket was copied back, so wait() on the work handle first.")
    if _caught_mid_ring(grads, per_param, rank):
        return (" Some gradients hold sums over only some of the ranks: their all-reduce was still running (the ring "
                "adds one rank's values at a time) when the bucket was copied back, so wait() on the work handle "
                "first.")
    return ""


def _caught_mid_ring(grads, per_param, rank):
    """Every element times the world size is this rank's gradient plus those of some other ranks, not all of them:
    a buffer copied while the ring was still adding into it."""
    n = len(per_param)
    own, others = flat(per_param[rank]), [flat(per_param[q]) for q in range(n) if q != rank]
    sums = [own + sum((o for o, keep in zip(others, bits) if keep), torch.zeros_like(own))
            for bits in itertools.product((0, 1), repeat=n - 1)]  # the last one: every rank
    got = flat(grads) * n
    gaps = torch.stack([(got - s).abs() for s in sums])
    return bool((gaps.min(0).values <= n * TOL).all()) and bool((gaps[-1] > n * TOL).any())


@public_check("4.3")
def buckets_launched_during_backward_and_averaged(ns):
    reducer_class = answer(ns, "Reducer")
    report = run_on_ranks(_on_ranks_reducer, 3, (reducer_class, 2, 0.0), "Reducer")
    _check_reducer_report(report, 3, range(3))


@public_check("4.3")
def finalize_waits_for_a_slow_rank(ns):
    reducer_class = answer(ns, "Reducer")
    report = run_on_ranks(_on_ranks_reducer, 2, (reducer_class, 1, SLOW_RANK_S), "Reducer with a slow rank")
    _check_reducer_report(report, 2, [0])
