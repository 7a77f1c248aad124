"""Checks of lab 4.2: a Bucket launches one async all-reduce when full and waits for it in finish()."""
import time

import torch
import torch.distributed as dist

from helpers.comm import CommLedger
from helpers.grading.checks.lab04.common import (
    SLOW_RANK_S,
    TOL,
    diagnose,
    flat,
    make_model,
    max_diff,
    nbytes,
    run_on_ranks,
)
from helpers.grading.registry import answer, public_check

RUNS_TO_SEE_ORDER = 3  # runs in which rank 0 must reach its last add_grad before the straggler, at least once


# ------------------------------------------------------------------------------------------------ question 4.2
def _grad(shape, rank, index, step, offset=0):
    """A gradient for parameter `index` on `rank` at `step`: different everywhere, reproducible here."""
    generator = torch.Generator().manual_seed(10_000 * step + 100 * index + rank + 100_003 * offset)
    return torch.randn(shape, generator=generator)


def _on_ranks_bucket(Bucket, steps, slow_rank_s, offset=0):
    """Fill one bucket (the MLP's last four tensors) for `steps` steps; report calls, clock marks and gradients.

    The marks are time.perf_counter() seconds, one clock for every process of the machine (CLOCK_MONOTONIC), so
    the checks can put one rank's events in order with another's: an all-reduce completes only once its LAST rank
    has joined, so a call that returned before some rank launched the all-reduce cannot have waited for it, and a
    call that returned after did, whatever the load on the machine.
    """
    rank, n = dist.get_rank(), dist.get_world_size()
    params = list(make_model(0).parameters())[::-1][:4]  # arrival order
    bucket = Bucket(params)
    report = []
    for step in range(steps):
        for i, p in enumerate(params):
            p.grad = _grad(p.shape, rank, i, step, offset)
        dist.barrier()  # the ranks start each step together (outside the ledger: not the bucket's collective)
        with CommLedger() as ledger:
            for p in params[:-1]:
                bucket.add_grad(p)
            early = len(ledger.records)
            if slow_rank_s and rank == n - 1:
                time.sleep(slow_rank_s)  # the straggler: its last gradient comes late
            launch_start = time.perf_counter()
            bucket.add_grad(params[-1])
            launch_end = time.perf_counter()
            launched = [(r.op, r.payload_bytes) for r in ledger.records[early:]]
            bucket.finish()
            finish_end = time.perf_counter()
            # Not finished when finish() returned: no end stamped yet, or stamped later (the stamp follows the end).
            reduces = [r for r in ledger.records[early:] if r.op == "all_reduce"]
            unfinished = sum(r.end is None or r.end > finish_end for r in reduces)
        report.append({"unfinished": unfinished, "early": [(r.op, r.payload_bytes) for r in ledger.records[:early]],
                       "launched": launched, "after_finish": len(ledger.records) - early - len(launched),
                       "launch_start": launch_start, "launch_end": launch_end, "finish_end": finish_end,
                       "grads": [p.grad.clone() for p in params]})
    return report


def _bucket_expected(step, world_size, offset=0):
    params = list(make_model(0).parameters())[::-1][:4]
    local = [[_grad(p.shape, r, i, step, offset) for i, p in enumerate(params)] for r in range(world_size)]
    mean = [sum(g[i] for g in local) / world_size for i in range(len(params))]
    return flat(mean), [flat(g) for g in local], flat([p.detach() for p in params])


def _check_bucket_report(report, world_size, ranks_to_check, offset=0):
    bucket_bytes = sum(nbytes(p) for p in list(make_model(0).parameters())[-4:])
    where = f"world size {world_size}, one bucket of 4 tensors ({bucket_bytes} bytes)"
    for rank in ranks_to_check:
        for step, r in enumerate(report[rank]):
            at = f"{where}, rank {rank}, step {step + 1}"
            assert not r["early"], (
                f"{at}: add_grad issued {r['early']} before the bucket was full (3 of 4 gradients in): launch ONE "
                "all-reduce per bucket, when its last gradient arrives, not one per parameter")
            if step > 0 and not r["launched"]:
                raise AssertionError(f"{at}: the bucket did not launch its all-reduce again at the second step: reset "
                                     "pending (and work) in finish(), so that the bucket can be reused")
            assert len(r["launched"]) == 1 and tuple(r["launched"][0]) == ("all_reduce", bucket_bytes), (
                f"{at}: expected one all_reduce of the whole flat buffer ({bucket_bytes} bytes) when the last gradient "
                f"arrived, got {r['launched']}")
            assert r["after_finish"] == 0, f"{at}: finish() issued {r['after_finish']} more collective(s): only wait"
            last_rank = max(range(world_size), key=lambda k: report[k][step]["launch_start"])
            assert r["finish_end"] >= report[last_rank][step]["launch_start"], (
                f"{at}: finish() returned before rank {last_rank} had launched its all-reduce, which cannot complete "
                "without it: finish() did not wait. wait() on the work handle, then copy the buffer back")
            mean, local, params = _bucket_expected(step, world_size, offset)
            got = flat(r["grads"])
            error = max_diff(got, mean)
            hint = diagnose(got, mean, local[rank], params, world_size)
            if not hint and r["unfinished"]:  # copied back mid-reduction: no one wrong answer matches the values
                hint = (" finish() returned before its all-reduce had finished, so the copy back read a buffer still "
                        "being reduced: wait() on the work handle first.")
            assert error <= TOL, (f"{at}: after finish(), max |p.grad - mean over ranks of the gradients| = "
                                  f"{error:.2e} (tolerance {TOL:.0e}).{hint}")


@public_check("4.2")
def one_all_reduce_per_bucket_and_the_mean(ns):
    bucket_class = answer(ns, "Bucket")
    for world_size in (3, 2):
        report = run_on_ranks(_on_ranks_bucket, world_size, (bucket_class, 2, 0.0), "Bucket")
        _check_bucket_report(report, world_size, range(world_size))


def seen_in_order(report):
    """Whether rank 0 reached its last add_grad before the straggler did (else the machine was too busy to tell)."""
    return report[0][0]["launch_start"] < report[1][0]["launch_start"]


def check_no_wait(report, offset=0):
    """The straggler run (2 ranks, rank 1 late): add_grad did not wait, finish() did; the values are the mean."""
    fast, slow = report[0][0], report[1][0]
    # Events in order, not durations: the all-reduce cannot complete before rank 1 launches it.
    assert fast["launch_end"] < slow["launch_start"], (
        f"rank 1 is {SLOW_RANK_S:g} s late: rank 0's add_grad of the last gradient returned only after rank 1 had "
        f"launched the all-reduce ({fast['launch_end'] - fast['launch_start']:.2f} s after it began), so it waited "
        "for the all-reduce. Launch it with async_op=True, keep the handle, and wait only in finish()")
    _check_bucket_report(report, 2, [0], offset)


@public_check("4.2")
def add_grad_does_not_wait_and_finish_does(ns):
    bucket_class = answer(ns, "Bucket")
    for _ in range(RUNS_TO_SEE_ORDER):
        report = run_on_ranks(_on_ranks_bucket, 2, (bucket_class, 1, SLOW_RANK_S), "Bucket with a slow rank")
        if seen_in_order(report):  # else rank 0 came even later than the straggler: again
            break
    else:
        raise AssertionError(f"in {RUNS_TO_SEE_ORDER} runs rank 0 reached its last add_grad only after rank 1, which "
                             f"sleeps {SLOW_RANK_S:g} s: the machine is too busy to tell; run the check again")
    check_no_wait(report)
