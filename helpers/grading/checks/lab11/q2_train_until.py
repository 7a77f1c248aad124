"""Checks of lab 11.2: train_until, the planted early stop that each rank decides on its own loss."""
import functools

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from helpers.backend import rank_device
from helpers.grading.checks.lab11 import common
from helpers.grading.checks.lab11.common import TOL, WORLD_SIZE, _flat, _launch, _max_diff, _memoized
from helpers.grading.registry import answer, public_check
from helpers.grading.shared_run import definitions

D_IN, ROWS, LR, MAX_STEPS, SEED = 3, 6, 0.1, 12, 7


def _data(rank):
    """Rank r's shard: its targets lie further from the model's reach the larger r, so its loss falls slower."""
    g = torch.Generator().manual_seed(SEED * 10 + rank + 1000 * common.OFFSET)
    X = torch.randn(ROWS, D_IN, generator=g)
    return X, X.sum(1, keepdim=True) * (1 + rank) + 0.5 * rank


def _model():
    torch.manual_seed(SEED + 1000 * common.OFFSET)  # the same start on every rank
    return nn.Linear(D_IN, 1)


def _trajectory(decide, steps=MAX_STEPS, target=None):
    """One process, every rank's shard: (updates made, parameters, mean losses seen) with decide(losses) -> value
    compared with the target; the mean gradient over ranks at each step."""
    model, shards, seen = _model(), [_data(r) for r in range(WORLD_SIZE)], []
    for step in range(steps):
        losses = [F.mse_loss(model(X), Y) for X, Y in shards]
        seen.append(decide(torch.stack(losses).detach()))
        if target is not None and seen[-1] < target:
            return step, _flat(model), seen
        model.zero_grad()
        (sum(losses) / WORLD_SIZE).backward()
        with torch.no_grad():
            for p in model.parameters():
                p -= LR * p.grad
    return steps, _flat(model), seen


_DECISIONS = {  # the rule the lab asks for, then the usual wrong ones with the mistake and its fix
    "mean": lambda losses: losses.sum().item() / WORLD_SIZE,
    "sum": lambda losses: losses.sum().item(),
    "rank0": lambda losses: losses[0].item(),
}
_MISTAKES = {
    "sum": "the SUM of the losses over ranks was compared with the target: divide by the world size to get the mean",
    "rank0": "every rank stopped on rank 0's loss (a broadcast): the target is on the mean over ranks: all_reduce "
             "the loss and divide by the world size",
}


@functools.cache
def target():
    """Halfway between the mean loss before update 5 and before update 6: the right rule stops after 5 updates;
    rank 0 alone would stop after 1, the sum never (12, max_steps)."""
    _, _, seen = _trajectory(_DECISIONS["mean"])
    return (seen[4] + seen[5]) / 2


@functools.cache
def _reference(rule="mean"):
    steps, params, _ = _trajectory(_DECISIONS[rule], target=target())
    return steps, params


def _train_on_rank(train_until, tgt):
    rank = dist.get_rank()
    model = _model().to(rank_device())
    X, Y = (t.to(rank_device()) for t in _data(rank))
    steps = train_until(model, X, Y, target=tgt, lr=LR, max_steps=MAX_STEPS)
    return steps, _flat(model)


def _results(ns):
    fn = answer(ns, "train_until")
    hint = ("the ranks stopped at different steps, each on its own loss, and the others wait in an all_reduce "
            "forever: decide on the mean loss over ranks (all_reduce a detached copy, divide by the world size). ")
    return _memoized("11.2", definitions(ns),
                     lambda: _launch(_train_on_rank, fn, target(), hint=hint))


@public_check("11.2")
def identical_parameters_on_every_rank(ns):
    results = _results(ns)
    for rank in range(1, WORLD_SIZE):
        assert torch.equal(results[rank][1], results[0][1]), (
            f"rank {rank}'s parameters differ from rank 0's by up to {_max_diff(results[rank][1], results[0][1]):.3g}:"
            " every rank must make the same updates with the averaged gradient: call average_gradients(model) "
            "after backward")


@public_check("11.2")
def every_rank_stops_where_the_mean_loss_reaches_the_target(ns):
    steps_right, _ = _reference()
    for rank, (steps, _) in enumerate(_results(ns)):
        if steps == steps_right:
            continue
        for rule, mistake in _MISTAKES.items():
            if steps == _reference(rule)[0]:
                raise AssertionError(f"rank {rank} made {steps} updates, not {steps_right}: {mistake}")
        raise AssertionError(f"rank {rank} made {steps} updates (returned {steps!r}); the mean loss over ranks falls "
                             f"below the target after {steps_right}: compare the mean loss before each update, "
                             "stop before updating, return the number of updates")


@public_check("11.2")
def equal_to_one_process_on_the_mean_loss(ns):
    _, expected = _reference()
    diff = _max_diff(_results(ns)[0][1], expected)
    assert diff < TOL, (f"after the updates the parameters differ from one process on the ranks' mean loss by "
                        f"{diff:.3g} (tolerance {TOL:g}): zero the gradients, backward, average_gradients, "
                        "p -= lr * p.grad")
