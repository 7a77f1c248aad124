"""Checks of lab 4.4: train_bucketed equals torch DDP, with one all-reduce per bucket per step."""
import torch
import torch.distributed as dist
import torch.nn.functional as F

from helpers.comm import CommLedger
from helpers.grading.checks.lab04.common import (
    CAP_MB,
    LR,
    MLP_BUCKETS,
    STEPS,
    TOL,
    flat,
    make_model,
    max_diff,
    rank_batch,
    run_on_ranks,
)
from helpers.grading.registry import answer, public_check


# ------------------------------------------------------------------------------------------------ question 4.4
def _on_ranks_train(train_bucketed, steps, lr, offset=0):
    """The student's loop and torch DDP on the same data; final parameters and all-reduces per run."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    rank = dist.get_rank()
    batches = [rank_batch(step, rank, offset) for step in range(steps)]
    model = make_model(100 + rank + 10 * offset)  # different initial weights: the Reducer's broadcast must fix that
    with CommLedger() as ledger:
        losses = train_bucketed(model, batches, lr, CAP_MB)
    calls = sum(r.op == "all_reduce" for r in ledger.records)
    ddp = DDP(make_model(100 + rank + 10 * offset), bucket_cap_mb=CAP_MB)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=lr)
    for x, y in batches:
        optimizer.zero_grad(set_to_none=True)
        F.mse_loss(ddp(x), y).backward()
        optimizer.step()
    return _flat_parameters(model), _flat_parameters(ddp), calls, losses


def _flat_parameters(module):
    return flat([p.detach() for p in module.parameters()])


@public_check("4.4")
def training_equals_torch_ddp_on_2_and_3_ranks(ns):
    fn = answer(ns, "train_bucketed")
    steps, lr, tol = int(ns.get("STEPS", STEPS)), float(ns.get("LR", LR)), float(ns.get("TOL", TOL))
    for world_size in (2, 3):
        results = run_on_ranks(_on_ranks_train, world_size, (fn, steps, lr), "train_bucketed")
        check_training(results, world_size, steps, lr, tol)


def check_training(results, world_size, steps, lr, tol, offset=0):
    """The assertions of the check above on one run's results (the grader's hidden test runs them too)."""
    n_buckets = len(MLP_BUCKETS)
    start = flat([p.detach() for p in make_model(100 + 10 * offset).parameters()])
    where = f"{world_size} ranks with different data, {steps} SGD steps (lr {lr})"
    ours = results[0][0]
    for rank, (params, _, calls, losses) in enumerate(results):
        assert torch.equal(params, ours), (
            f"{where}: rank {rank}'s parameters differ from rank 0's by {max_diff(params, ours):.2e}: the ranks "
            "stepped with different gradients. Does every step call reducer.finalize() BEFORE optimizer.step()?")
        assert calls == steps * n_buckets, (
            f"{where}: rank {rank} issued {calls} all-reduces, expected {steps * n_buckets} ({n_buckets} buckets x "
            f"{steps} steps). Build ONE Reducer before the loop (each Reducer registers its own hooks)")
        assert isinstance(losses, (list, tuple)) and len(losses) == steps, (
            f"{where}: train_bucketed should return {steps} losses (one per step), got {losses!r}")
    assert max_diff(ours, start) > 0, f"{where}: the parameters never changed"
    error = max_diff(ours, results[0][1])
    assert error <= tol, (f"{where}: identical on every rank, but max |parameters - torch DDP| = {error:.2e} "
                          f"(tolerance {tol:.0e})")
