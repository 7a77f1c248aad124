"""Checks of lab 5.1: accumulate_and_step, one bucket set per optimizer step and the whole-batch result."""
import math

import torch
import torch.distributed as dist
import torch.nn.functional as F

from helpers.comm import CommLedger
from helpers.grading.checks.lab05.common import (
    TOL,
    flat_params,
    make_batch,
    make_model,
    max_diff,
    run_on_ranks,
    sgd_step,
)
from helpers.grading.registry import answer, public_check

BUCKET_CAP_MB = 0.004  # about 4 KB: this model's 5.5 KB of gradients take two buckets
MICRO_SIZES = ([2, 5, 1], [4, 4], [8])  # rank r's micro-batch sizes in 5.1: unequal, 8 samples on every rank
COUNT_SIZES = ([3, 3, 2], [5, 2, 1])  # the count check: as many micro-batches on every rank, of unequal sizes


# ------------------------------------------------------------------------------------------------ question 5.1
def rank_micro_batches(sizes, rank, step):
    """Rank `rank`'s micro-batches at `step`, of the given sizes: different data on every rank and step."""
    x, y = make_batch(sum(sizes), seed=1000 * rank + 10 * step + 1)
    return list(zip(x.split(sizes), y.split(sizes)))


def all_reduce_calls(ledger):
    return ledger.totals().get("all_reduce", {"calls": 0})["calls"]


def count_rank(fn, steps, lr):
    """On each rank: the all-reduces of one plain DDP step (a bucket set), then of every step of the answer."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    rank = dist.get_rank()
    plain = DDP(make_model(), bucket_cap_mb=BUCKET_CAP_MB)
    for step in range(3):  # count at step 3: DDP rebuilds its buckets after step 1
        x, y = make_batch(8, seed=1000 * rank + step + 500)
        plain.zero_grad()
        with CommLedger() as ledger:
            F.cross_entropy(plain(x), y).backward()
    bucket_set = all_reduce_calls(ledger)
    model = DDP(make_model(), bucket_cap_mb=BUCKET_CAP_MB)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    calls = []
    for step in range(steps):
        with CommLedger() as ledger:
            fn(model, optimizer, rank_micro_batches(COUNT_SIZES[rank], rank, step), F.cross_entropy)
        calls.append(all_reduce_calls(ledger))
    return bucket_set, calls


@public_check("5.1")
def one_bucket_set_per_optimizer_step(ns):
    fn = answer(ns, "accumulate_and_step")
    steps = 4
    results = run_on_ranks(count_rank, len(COUNT_SIZES), args=(fn, steps, 0.1))
    for rank, (bucket_set, calls) in enumerate(results):
        micro = len(COUNT_SIZES[rank])
        where = (f"rank {rank}, {micro} micro-batches per step, DDP with {bucket_set} buckets: all-reduces at steps "
                 f"1..{steps} = {calls}")
        for count in calls[2:]:
            if count == micro * bucket_set:
                raise AssertionError(
                    f"{where}: the gradients were all-reduced at every micro-batch ({micro} x {bucket_set}). Run the "
                    "forward AND the backward of every micro-batch but the last inside `with model.no_sync():` (a "
                    "backward inside no_sync whose forward ran outside it is still synchronised: DDP reads the flag "
                    "in the forward)")
            if count == 0:
                raise AssertionError(
                    f"{where}: no all-reduce at all, so the ranks never synchronise. The last micro-batch must run "
                    "outside no_sync()")
            assert count == bucket_set, (
                f"{where}: expected exactly one bucket set ({bucket_set} all-reduces) per optimizer step from step 3 "
                "on, and no collectives of your own")


def train_rank(fn, steps, lr):
    """On each rank: `steps` calls of the answer on a DDP model; the parameters and the returned losses."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    rank = dist.get_rank()
    model = DDP(make_model())
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    losses = [fn(model, optimizer, rank_micro_batches(MICRO_SIZES[rank], rank, step), F.cross_entropy)
              for step in range(steps)]
    return flat_params(model.module), losses


def one_process(steps, lr, weighting="size", zero_grad=True):
    """The parameters after `steps` SGD steps of one process emulating the ranks, and each rank's loss per step.

    weighting "size" (right: the mean over every sample of the global batch), "count" (each micro-batch's mean loss
    divided by the number of micro-batches) or "none" (micro-batch mean losses summed); zero_grad=False keeps the
    previous steps' gradients. The gradients of the ranks are averaged, as DDP does."""
    model = make_model()
    losses = []
    total = [torch.zeros_like(p) for p in model.parameters()]
    for step in range(steps):
        if zero_grad:
            total = [torch.zeros_like(p) for p in model.parameters()]
        step_losses = []
        for rank, sizes in enumerate(MICRO_SIZES):
            loss_sum = 0.0
            for x, y in rank_micro_batches(sizes, rank, step):
                weight = {"size": len(y) / sum(sizes), "count": 1 / len(sizes), "none": 1.0}[weighting]
                model.zero_grad()
                loss = F.cross_entropy(model(x), y)
                (loss * weight).backward()
                loss_sum += loss.item() * len(y) / sum(sizes)
                total = [t + p.grad / len(MICRO_SIZES) for t, p in zip(total, model.parameters())]
            step_losses.append(loss_sum)
        losses.append(step_losses)
        with torch.no_grad():
            for p, g in zip(model.parameters(), total):
                p -= lr * g
    return flat_params(model), losses


def whole_batch_reference(steps, lr):
    """One process on the whole global batch (every rank's micro-batches) at every step, mean loss, plain SGD."""
    model = make_model()
    for step in range(steps):
        batches = [b for rank, sizes in enumerate(MICRO_SIZES) for b in rank_micro_batches(sizes, rank, step)]
        model.zero_grad()
        F.cross_entropy(model(torch.cat([b[0] for b in batches])), torch.cat([b[1] for b in batches])).backward()
        sgd_step(model, lr)
    return flat_params(model)


@public_check("5.1")
def same_steps_as_one_process_on_the_whole_batch(ns):
    fn = answer(ns, "accumulate_and_step")
    steps, lr = 2, 0.5
    results = run_on_ranks(train_rank, len(MICRO_SIZES), args=(fn, steps, lr))
    where = f"{len(MICRO_SIZES)} ranks with micro-batches of {list(MICRO_SIZES)} samples, {steps} SGD steps"
    params = [p for p, _ in results]
    for rank, p in enumerate(params):
        assert torch.equal(p, params[0]), (
            f"{where}: rank {rank}'s parameters differ from rank 0's by {max_diff(p, params[0]):.2e}: the ranks did "
            "not step with the same gradient. Did the last micro-batch run inside no_sync()?")
    error = max_diff(params[0], whole_batch_reference(steps, lr))
    if error > TOL:
        hints = {"count": "each micro-batch's mean loss was divided by the number of micro-batches: with "
                          "micro-batches of unequal sizes, weight micro-batch i by len(y_i) / (this rank's samples)",
                 "none": "the micro-batch losses were not scaled, so the gradient is a sum of micro-batch means: "
                         "weight micro-batch i by len(y_i) / (this rank's samples)"}
        hint = next((text for weighting, text in hints.items()
                     if max_diff(params[0], one_process(steps, lr, weighting)[0]) <= TOL), "")
        if not hint and max_diff(params[0], one_process(steps, lr, zero_grad=False)[0]) <= TOL:
            hint = "the previous step's gradients were still in .grad: start with optimizer.zero_grad()"
        raise AssertionError(f"{where}: identical on every rank, but max |parameters - one process on the whole "
                             f"batch| = {error:.2e} (tolerance {TOL:.0e}). {hint}")
    expected_losses = one_process(steps, lr)[1]
    for rank, (_, losses) in enumerate(results):
        got = [float(v) for v in losses]
        want = [step_losses[rank] for step_losses in expected_losses]
        close = len(got) == len(want) and all(math.isclose(a, b, rel_tol=1e-4, abs_tol=1e-5)
                                              for a, b in zip(got, want))
        assert close, (f"{where}: rank {rank} returned losses {got}, expected its mean loss over its samples at each "
                       f"step: {want}")
