"""Checks of lab 7.3: reduce_scatter_gradients, one reduce-scatter to this rank's shard of the mean gradient."""
import math

import torch
import torch.distributed as dist
import torch.nn as nn

from helpers.comm import CommLedger
from helpers.grading.checks.lab07 import common
from helpers.grading.checks.lab07.common import (
    TOL,
    WORLD_SIZE,
    _flat,
    _max_diff,
    _ops,
    _padded_shard,
    _shared_launch,
)
from helpers.grading.registry import answer, public_check
from helpers.grading.shared_run import definitions
from helpers.memory import state_bytes

# --- 7.3 reduce_scatter_gradients ---------------------------------------------------------------

def _model_7_3():
    torch.manual_seed(3 + common.OFFSET)
    return nn.Sequential(nn.Linear(5, 4), nn.Tanh(), nn.Linear(4, 2))  # 34 parameters: shards of 12, 2 padding


def _reduce_on_rank(fn):
    """Runs on every rank: the same model, different data; on rank 1 one gradient is missing; the student's call."""
    rank = dist.get_rank()
    model = _model_7_3()
    x = torch.randn(3 + rank, 5, generator=torch.Generator().manual_seed(30 + rank + 10 * common.OFFSET))
    model(x).square().mean().backward()
    if rank == 1:
        model[2].bias.grad = None  # as if rank 1's forward had not used it
    params = list(model.parameters())
    local = [torch.zeros_like(p) if p.grad is None else p.grad.clone() for p in params]
    before = _flat(params).clone()
    with CommLedger() as ledger:
        shard = fn(params)
    is_tensor = isinstance(shard, torch.Tensor)
    held = state_bytes(model, extra={"grads": [shard]} if is_tensor else None)
    return {"local": _flat(local), "shard": shard.detach().clone() if is_tensor else shard,
            "grads_left": [n for (n, p) in model.named_parameters() if p.grad is not None],
            "records": _ops(ledger.records), "held": held, "params_moved": not torch.equal(before, _flat(params))}


# What a run that did not finish says first, and Gloo's error of an unpadded input with what it means (the grader's
# hidden test says them too).
HINT = ("Every rank must pass an input of the same size (world_size x shard size, zeros for a missing gradient) to one "
        "dist.reduce_scatter_single. ")
SIZE_ERROR = "outputShape[0] * worldSize == inputShape[0]"  # Gloo's own check: the input is not N x the output
UNPADDED = ("the input of dist.reduce_scatter_single is not world_size x the shard size: the flat gradient is not "
            "padded. Append zeros up to world_size * s elements, s = ceil(numel / world_size). ")


def _reduce_results(ns):
    fn = answer(ns, "reduce_scatter_gradients")
    return _shared_launch("7.3", definitions(ns), fn, _reduce_on_rank, HINT, SIZE_ERROR, UNPADDED)


def _mean_local(results):
    return sum(r["local"] for r in results) / WORLD_SIZE


@public_check("7.3")
def shard_of_the_mean_gradient(ns):
    results = _reduce_results(ns)
    mean = _mean_local(results)
    size = math.ceil(mean.numel() / WORLD_SIZE)
    for rank, result in enumerate(results):
        shard = result["shard"]
        assert isinstance(shard, torch.Tensor) and shard.shape == (size,), (
            f"rank {rank} returned {type(shard).__name__} {tuple(getattr(shard, 'shape', ()))}; expected a 1-D "
            f"tensor of {size} elements (its shard of the {mean.numel()} gradient elements padded to "
            f"{size * WORLD_SIZE})")
        expected = _padded_shard(mean, rank, WORLD_SIZE)
        if _max_diff(shard, WORLD_SIZE * expected) < TOL < _max_diff(shard, expected):
            raise AssertionError(f"rank {rank}'s shard is the SUM over the {WORLD_SIZE} ranks: divide by the world "
                                 "size. (Adam would almost hide this bug: its update barely changes when the "
                                 "gradient is scaled, so test the gradient itself)")
        diff = _max_diff(shard, expected)
        assert diff < TOL, (f"rank {rank}'s shard differs from its shard of the mean gradient (elements "
                            f"{rank * size} .. {(rank + 1) * size - 1} of the padded flat gradient) by {diff:.3g}")


@public_check("7.3")
def missing_gradient_counts_as_zeros(ns):
    """Rank 1's last bias has no gradient: it must still take its place in the flat gradient, as zeros."""
    results = _reduce_results(ns)
    mean = _mean_local(results)
    last = _padded_shard(mean, WORLD_SIZE - 1, WORLD_SIZE)  # the last 2 real elements (2.bias) are in rank 2's shard
    diff = _max_diff(results[-1]["shard"], last)
    assert diff < TOL, (f"rank 2's shard (which holds the last bias) is wrong by {diff:.3g}: on rank 1 that bias's "
                        ".grad is None; it must count as zeros, at its own place in the flat gradient")


@public_check("7.3")
def full_gradients_are_freed(ns):
    for rank, result in enumerate(_reduce_results(ns)):
        assert not result["grads_left"], (f"rank {rank}: {result['grads_left']} still have a .grad; ZeRO-2 keeps only "
                                          "the gradient shard: set every p.grad = None after the reduce-scatter "
                                          "(zeroing a .grad keeps its memory)")
        assert not result["params_moved"], f"rank {rank}: the parameters changed; only the gradients may be touched"


@public_check("7.3")
def one_reduce_scatter(ns):
    results = _reduce_results(ns)
    padded = math.ceil(results[0]["local"].numel() / WORLD_SIZE) * WORLD_SIZE
    for rank, result in enumerate(results):
        assert [tuple(r) for r in result["records"]] == [("reduce_scatter", 4 * padded)], (
            f"rank {rank}: the ledger shows {result['records']}; expected exactly one reduce_scatter of the padded "
            f"flat gradient ({padded} float32 = {4 * padded} bytes of input). An all_reduce sums the other ranks' "
            "shards for nothing")


@public_check("7.3")
def gradient_bytes_are_one_nth(ns):
    results = _reduce_results(ns)
    numel = results[0]["local"].numel()
    size = math.ceil(numel / WORLD_SIZE)
    for rank, result in enumerate(results):
        grads = result["held"]["grads"]
        assert grads == 4 * size, (f"rank {rank} holds {grads} bytes of gradients after the call (state_bytes: "
                                   f".grad of the parameters + the returned shard); expected only the shard: "
                                   f"4 x {size} = {4 * size} bytes, vs {4 * numel} for DDP's full gradient")
