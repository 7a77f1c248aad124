"""Checks of lab 8.4: FlatShard.reduce_scatter_grads accumulates this rank's shard of the mean gradient; bfloat16
gradients are reduced in reduce_dtype and land in the float32 shard."""
import torch
import torch.distributed as dist

from helpers.comm import CommLedger
from helpers.grading.checks.lab08 import common
from helpers.grading.checks.lab08.common import (
    BF16,
    TOL,
    UNITS,
    WORLD_SIZE,
    _case,
    _diff,
    _each,
    _error,
    _method,
    _results,
)
from helpers.grading.registry import public_check
from helpers.grading.shared_run import definitions
from helpers.memory import state_bytes

# --- 8.4 reduce_scatter_grads -------------------------------------------------------------------------------------

def _local_grad(rank, padded, numel, call):
    """Rank's flat.grad in call `call`: random, zeros at the padding (as backward through the views leaves it)."""
    grad = torch.randn(padded, generator=torch.Generator().manual_seed(100 * call + rank + 1000 * common.OFFSET))
    grad[numel:] = 0
    return grad


def _reduce_on_rank(cls):
    out = {}
    for case, (make, features) in UNITS.items():
        module, unit, _, got = _case(cls, make, features)
        before, got["calls"] = unit.flat_shard.detach().clone(), []
        for call in range(2):  # the second accumulates onto the first
            unit.flat.grad = _local_grad(dist.get_rank(), unit.padded_numel, unit.numel, call)
            with CommLedger() as ledger:
                unit.reduce_scatter_grads()
            grad, left = unit.flat_shard.grad, unit.flat.grad
            held = state_bytes(module, extra={"grads": [] if left is None else [left]})["grads"]  # flat.grad too
            got["calls"].append({"grad": None if grad is None else grad.clone(), "left": left is not None,
                                 "ops": [(r.op, r.payload_bytes) for r in ledger.records], "bytes": held})
        got["moved"] = not torch.equal(before, unit.flat_shard.detach())
        out[case] = got
    for case, reduce_dtype in {"bfloat16 block": None, "bfloat16 block (float32 reduction)": torch.float32}.items():
        out[case] = _mixed_reduce(cls, reduce_dtype)
    return out


def _mixed_reduce(cls, reduce_dtype):
    """One reduce_scatter_grads of a bfloat16 flat.grad, in a unit of param_dtype bfloat16."""
    _, unit, _, got = _case(cls, *UNITS["block"], BF16, reduce_dtype)
    unit.flat.grad = _local_grad(dist.get_rank(), unit.padded_numel, unit.numel, 0).to(BF16)
    got.update(error=None, reduce_dtype=str(unit.reduce_dtype), ops=[])
    try:
        with CommLedger() as ledger:
            unit.reduce_scatter_grads()
    except Exception as exc:  # noqa: BLE001 - reported by the check
        got["error"] = _error(exc)
    grad = unit.flat_shard.grad
    got.update(grad=None if grad is None else grad.clone(), ops=[(r.op, r.payload_bytes) for r in ledger.records])
    return got


def _r84(ns):
    cls, fn = _method(ns, "reduce_scatter_grads")
    return _results("8.4", (fn, definitions(ns)), _reduce_on_rank, (WORLD_SIZE,), cls)


def _mean_shard(n, rank, numel, size, calls):
    mean = sum(_local_grad(r, size * n, numel, c) for r in range(n) for c in calls) / n
    return mean[rank * size : (rank + 1) * size]


@public_check("8.4")
def shard_of_the_mean_gradient_accumulated(ns):
    for where, n, rank, got, size in _each(_r84(ns)):
        grad, expected = got["calls"][0]["grad"], _mean_shard(n, rank, got["numel"], size, [0])
        assert grad is not None and grad.shape == (size,), (
            f"{where}: flat_shard.grad is {None if grad is None else tuple(grad.shape)}; expected ({size},), this "
            "rank's shard of the mean gradient")
        assert not _diff(grad, n * expected) < TOL < _diff(grad, expected), (
            f"{where}: flat_shard.grad is the SUM over the {n} ranks: divide by the world size (DDP averages)")
        assert _diff(grad, expected) < TOL, (f"{where}: flat_shard.grad differs by {_diff(grad, expected):.3g} from "
                                             f"elements [{rank * size}, {(rank + 1) * size}) of the mean flat.grad")
        grad, expected = got["calls"][1]["grad"], _mean_shard(n, rank, got["numel"], size, [0, 1])
        second = _mean_shard(n, rank, got["numel"], size, [1])
        assert grad is None or _diff(grad, expected) < TOL or _diff(grad, second) >= TOL, (
            f"{where}: after a second backward's reduce_scatter_grads, flat_shard.grad is the second shard alone: "
            "it overwrote the first; add it to flat_shard.grad when that is not None (gradients accumulate until "
            "zero_grad, as in torch)")
        assert grad is not None and _diff(grad, expected) < TOL, (
            f"{where}: after a second backward's reduce_scatter_grads, flat_shard.grad should be the sum of both mean "
            "shards (gradients accumulate until zero_grad, as in torch); it is not")


@public_check("8.4")
def frees_the_full_gradient(ns):
    for where, n, rank, got, size in _each(_r84(ns)):
        for call in got["calls"]:
            assert not call["left"] and call["bytes"] == 4 * size, (
                f"{where}: after reduce_scatter_grads the unit holds {call['bytes']} bytes of gradient (flat.grad is "
                f"None: {not call['left']}); expected only the shard's 4 x {size}: set self.flat.grad = None")
        assert not got["moved"], f"{where}: flat_shard changed; only its .grad may be touched"


@public_check("8.4")
def one_reduce_scatter_of_the_padded_gradient(ns):
    for where, n, rank, got, size in _each(_r84(ns)):
        expected = [("reduce_scatter", 4 * size * n)]
        for call in got["calls"]:
            assert call["ops"] == expected, (
                f"{where}: the ledger shows {call['ops']} (op, bytes); expected {expected}: one "
                "dist.reduce_scatter_single of the padded flat.grad (an all_reduce sends twice the bytes)")


@public_check("8.4")
def reduces_in_reduce_dtype_into_the_float32_shard(ns):
    for where, n, rank, got, size in _each(_r84(ns), mixed=True):
        hint = (": cast the mean to flat_shard's dtype (float32) before it becomes flat_shard.grad"
                if "dtype" in (got["error"] or "") else "")
        assert got["error"] is None, (
            f"{where}: reduce_scatter_grads of a bfloat16 flat.grad raised {got['error']}{hint}")
        item = 4 if got["reduce_dtype"] == "torch.float32" else 2
        expected = [("reduce_scatter", item * size * n)]
        assert got["ops"] == expected, (
            f"{where}: the ledger shows {got['ops']} (op, bytes) with reduce_dtype {got['reduce_dtype']}; expected "
            f"{expected}: cast flat.grad to reduce_dtype for the reduce-scatter")
        grad = got["grad"]
        assert grad is not None and grad.dtype == torch.float32 and grad.shape == (size,), (
            f"{where}: flat_shard.grad is {None if grad is None else (grad.dtype, tuple(grad.shape))}; expected "
            f"float32 of ({size},): the mean lands in the float32 master's gradient")
        # the exact mean of the ranks' bfloat16 gradients; a float32 sum of three of them is exact, and a bfloat16
        # sum of N terms rounds N - 1 times, then the division once: each by at most 2**-8 of what is summed
        local = [_local_grad(r, size * n, got["numel"], 0).to(BF16).double()[rank * size : (rank + 1) * size]
                 for r in range(n)]
        mean, scale = sum(local) / n, sum(g.abs() for g in local) / n
        bound = TOL + (0 if item == 4 else n * 2**-8) * scale
        assert ((grad.double() - mean).abs() <= bound).all(), (
            f"{where}: flat_shard.grad differs from this rank's shard of the mean gradient by up to "
            f"{(grad.double() - mean).abs().max().item():.3g}")
