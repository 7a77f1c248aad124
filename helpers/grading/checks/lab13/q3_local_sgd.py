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
WRONG = {  # the usual wrong versions, run on the same ranks and batches; a wrong answer is named by the one it equals
    "gradients averaged": ("the GRADIENTS were averaged at the averaging steps, not the parameters: the ranks "
                           "drifted apart during the local steps and stay apart; all-reduce the parameters "
                           "themselves, divide by the world size, copy them back"),
    "no division": f"the SUM of the parameters over ranks: divide by the world size ({WORLD_SIZE})",
    "divided by 2": f"the sum was divided by 2, not by the world size ({WORLD_SIZE}): divide by dist.get_world_size()",
    "off by one": (f"the averages came after steps 1, {PERIOD + 1}, {2 * PERIOD + 1}: average after steps {PERIOD}, "
                   f"{2 * PERIOD}, ...: when (step + 1) % period == 0 (steps counted from 0)"),
}
HINT = "Every rank must average at the same steps: one all-reduce of its parameters every `period` steps. "


def reference_local_sgd(model, optimizer, batches, period, mistake=None):
    """The lab's local_sgd; `mistake` switches one part to a usual wrong version (see WRONG)."""
    world = {"no division": 1, "divided by 2": 2}.get(mistake, dist.get_world_size())
    snapshots = []
    for step, (inputs, targets) in enumerate(batches):
        optimizer.zero_grad()
        F.mse_loss(model(inputs), targets).backward()
        average = (step % period == 0) if mistake == "off by one" else ((step + 1) % period == 0)
        if average and mistake == "gradients averaged":
            grads = torch.nn.utils.parameters_to_vector([p.grad for p in model.parameters()])
            dist.all_reduce(grads)
            torch.nn.utils.vector_to_parameters(grads / world, [p.grad for p in model.parameters()])
        optimizer.step()
        if average:
            if mistake != "gradients averaged":
                with torch.no_grad():
                    params = torch.nn.utils.parameters_to_vector(model.parameters())
                    dist.all_reduce(params)
                    torch.nn.utils.vector_to_parameters(params / world, model.parameters())
            snapshots.append(flat(model.parameters()))
    return snapshots


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


def _torch_local_sgd(model, optimizer, batches, period):
    """PyTorch's local SGD: PeriodicModelAverager after every step, averaging after steps period, 2 period, ..."""
    from torch.distributed.algorithms.model_averaging.averagers import PeriodicModelAverager

    averager, snapshots = PeriodicModelAverager(period=period, warmup_steps=period - 1), []
    for step, (inputs, targets) in enumerate(batches):
        optimizer.zero_grad()
        F.mse_loss(model(inputs), targets).backward()
        optimizer.step()
        averager.average_parameters(model.parameters())
        if (step + 1) % period == 0:
            snapshots.append(flat(model.parameters()))
    return snapshots


def _on_rank(local_sgd):
    """Runs on every rank: the student's local SGD, PyTorch's, the wrong versions, and DDP for steps / period steps."""
    from helpers.comm import CommLedger

    out = {"mine": part_or_error(_run, local_sgd), "torch": _run(_torch_local_sgd)}
    for mistake in WRONG:
        out[mistake] = _run(reference_local_sgd, mistake=mistake)["params"]
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
            if max_diff(_mine(results[0])["params"], results[0]["gradients averaged"]) <= TOL:
                raise AssertionError(WRONG["gradients averaged"])
            raise AssertionError(f"after average {k + 1} (step {(k + 1) * PERIOD}) rank {rank}'s parameters differ "
                                 f"from rank 0's by {diff:.3g}: every rank must take the same mean of the "
                                 "parameters (one all-reduce, divided by the world size) and copy it back")


@public_check("13.3")
def equal_to_PeriodicModelAverager(ns):
    result = _results(ns)[0]
    mine = _mine(result)["params"]
    diff = max_diff(mine, result["torch"]["params"])
    if diff <= TOL:
        return
    for mistake, why in WRONG.items():
        if max_diff(mine, result[mistake]) <= TOL:
            raise AssertionError(why)
    raise AssertionError(f"after {STEPS} steps the parameters differ from PeriodicModelAverager's (period {PERIOD}) "
                         f"by {diff:.3g} (tolerance {TOL:g}): each step zero_grad, mse_loss backward, "
                         "optimizer.step(); after steps period, 2 period, ... the mean of the parameters over ranks")
