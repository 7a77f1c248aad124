"""Checks of lab 13.3: local_sgd, SGD on every rank's own data with the parameters averaged every `period` steps.

After every average the ranks must hold identical parameters, equal (within float32 rounding) to PyTorch's
PeriodicModelAverager's; and the ledger must count as many bytes as DDP sends in steps / period steps.
"""
import torch
import torch.distributed as dist
import torch.nn.functional as F

from helpers.grading.checks.lab13 import common
from helpers.grading.checks.lab13.common import (
    LR,
    TOL,
    WORLD_SIZE,
    _launch,
    _memoized,
    batch,
    flat,
    make_model,
    max_diff,
    train_ddp,
)
from helpers.grading.registry import answer, public_check
from helpers.grading.shared_run import definitions, part_or_error

STEPS, PERIOD = 12, 4  # three averages, after steps 4, 8 and 12
GRADIENTS = ("the GRADIENTS were averaged (or the mean was not copied back into the model): all-reduce the parameters "
             "themselves, divide by the world size, copy them back")
OFF_BY_ONE = (f"the averages came after steps 1, {PERIOD + 1}, {2 * PERIOD + 1}: average after steps {PERIOD}, "
              f"{2 * PERIOD}, ...: when (step + 1) % period == 0 (steps counted from 0)")
HINT = "Every rank must average at the same steps: one all-reduce of its parameters every `period` steps. "


def _run(fn, **kwargs):
    """fn on this rank's batches, from the checks' model: its return value, the parameters, the ledger's bytes."""
    from helpers.comm import CommLedger

    model = make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    batches = [batch(dist.get_rank(), step) for step in range(STEPS)]
    with CommLedger() as ledger:
        returned = fn(model, optimizer, batches, PERIOD, **kwargs)
    if isinstance(returned, (list, tuple)):
        returned = [flat([t]) if isinstance(t, torch.Tensor) else t for t in returned]
    return {"snapshots": returned, "params": flat(model.parameters()),
            "bytes": sum(r.payload_bytes for r in ledger.records), "ops": sorted({r.op for r in ledger.records})}


def _torch_local_sgd(model, optimizer, batches, period, warmup=None):
    """PyTorch's local SGD: PeriodicModelAverager after every step, averaging after steps period, 2 period, ...
    (warmup=0: after steps 1, period + 1, ...: the average one step early)."""
    from torch.distributed.algorithms.model_averaging.averagers import PeriodicModelAverager

    warmup = period - 1 if warmup is None else warmup
    averager, snapshots = PeriodicModelAverager(period=period, warmup_steps=warmup), []
    for step, (inputs, targets) in enumerate(batches):
        optimizer.zero_grad()
        F.mse_loss(model(inputs), targets).backward()
        optimizer.step()
        averager.average_parameters(model.parameters())
        if (step - warmup) % period == 0 and step >= warmup:
            snapshots.append(flat(model.parameters()))
    return snapshots


def _on_rank(local_sgd):
    """Runs on every rank: the student's local SGD, PyTorch's (and PyTorch's one step early), and DDP for steps / period
    steps."""
    from helpers.comm import CommLedger

    out = {"mine": part_or_error(_run, local_sgd), "torch": _run(_torch_local_sgd),
           "torch one step early": _run(_torch_local_sgd, warmup=0)["params"]}
    with CommLedger() as ledger:
        train_ddp(None, None, STEPS // PERIOD)
    out["ddp bytes"] = sum(r.payload_bytes for r in ledger.records if r.op == "all_reduce")
    return out


def _results(ns):
    fn = answer(ns, "local_sgd")
    return _memoized("13.3", definitions(ns), lambda: _launch(_on_rank, fn, hint=HINT))


def _mine(result):
    run = result["mine"]
    if isinstance(run, dict) and "error" in run:
        raise AssertionError(f"local_sgd raised {run['error'].splitlines()[0][:200]}")
    return run


@public_check("13.3")
def bytes_of_ddp_with_steps_over_period_steps(ns):
    result = _results(ns)[0]
    mine, param_bytes = _mine(result), 4 * common.numel()
    syncs = STEPS // PERIOD
    assert mine["bytes"] != STEPS * param_bytes, (
        f"{mine['bytes']} bytes all-reduced in {STEPS} steps: the parameters were averaged after every step; average "
        f"them every `period` ({PERIOD}) steps: {syncs} x {param_bytes} = {syncs * param_bytes} bytes")
    assert mine["bytes"] == result["ddp bytes"] == syncs * param_bytes, (
        f"{mine['bytes']} bytes all-reduced in {STEPS} steps (collectives {mine['ops']}); one average is one "
        f"all-reduce of all the parameters ({param_bytes} bytes), {syncs} of them: {syncs * param_bytes} bytes, what "
        f"DDP sends in {syncs} steps")


@public_check("13.3")
def identical_after_every_average(ns):
    results = _results(ns)
    snapshots = [_mine(result)["snapshots"] for result in results]
    length = len(snapshots[0]) if isinstance(snapshots[0], list) else "-"
    assert isinstance(snapshots[0], list) and length == STEPS // PERIOD, (
        f"local_sgd returned {type(snapshots[0]).__name__} of length {length}; "
        f"expected a list of {STEPS // PERIOD} flat parameter tensors, one after each average ({STEPS} steps, "
        f"period {PERIOD})")
    for rank in range(1, WORLD_SIZE):
        for k, (mine, first) in enumerate(zip(snapshots[rank], snapshots[0])):
            diff = max_diff(mine, first)
            if diff == 0:
                continue
            raise AssertionError(f"right after average {k + 1} (step {(k + 1) * PERIOD}) rank {rank}'s parameters "
                                 f"differ from rank 0's by {diff:.3g}: {GRADIENTS}")


def _divisor(result):
    """What the student's first average divided the sum by: the ranks held the same parameters as PyTorch's run just
    before it, so the first snapshot is WORLD_SIZE / divisor times PyTorch's (None without a first snapshot)."""
    mine, theirs = _mine(result)["snapshots"], result["torch"]["snapshots"]
    first = mine[0] if isinstance(mine, list) and mine else None
    if not isinstance(first, torch.Tensor) or first.shape != theirs[0].shape:
        return None
    scale = (first.double() @ theirs[0].double()) / (theirs[0].double() @ theirs[0].double())
    return WORLD_SIZE / scale.item() if scale.item() else None


@public_check("13.3")
def equal_to_PeriodicModelAverager(ns):
    result = _results(ns)[0]
    mine = _mine(result)["params"]
    diff = max_diff(mine, result["torch"]["params"])
    if diff <= TOL:
        return
    if max_diff(mine, result["torch one step early"]) <= TOL:
        raise AssertionError(OFF_BY_ONE)
    divisor = _divisor(result)
    if divisor is not None and abs(divisor - round(divisor)) < 0.05 and round(divisor) != WORLD_SIZE:
        raise AssertionError(f"the SUM of the parameters over ranks: divide by the world size ({WORLD_SIZE})"
                             if round(divisor) == 1 else f"the sum was divided by {round(divisor)}, not by the world "
                             f"size ({WORLD_SIZE}): divide by dist.get_world_size()")
    raise AssertionError(f"after {STEPS} steps the parameters differ from PeriodicModelAverager's (period {PERIOD}) "
                         f"by {diff:.3g} (tolerance {TOL:g}): each step zero_grad, mse_loss backward, "
                         "optimizer.step(); after steps period, 2 period, ... the mean of the parameters over ranks")
