"""Checks of lab 8.2: FlatShard.unshard, one all-gather into self.flat and autograd views of it as the parameters;
in a bfloat16 unit, the gather and the views in bfloat16."""
import math

import torch

from helpers.comm import CommLedger
from helpers.grading.checks.lab08.common import (
    BF16,
    TOL,
    UNITS,
    WORLD_SIZE,
    _case,
    _diff,
    _each,
    _error,
    _head,
    _method,
    _results,
)
from helpers.grading.registry import public_check
from helpers.grading.shared_run import definitions

# --- 8.2 unshard --------------------------------------------------------------------------------------------------

def _unshard_on_rank(cls):
    out = {}
    cases = {**{case: (*unit, None) for case, unit in UNITS.items()}, "bfloat16 block": (*UNITS["block"], BF16)}
    for case, (make, features, param_dtype) in cases.items():
        module, unit, x, got = _case(cls, make, features, param_dtype)
        flat = unit.flat
        try:
            with CommLedger() as ledger:
                unit.unshard()
        except Exception as exc:  # float32: the run's error (raised again); bfloat16: the check's
            if param_dtype is None:
                raise
            out[case] = {**got, "unshard_error": _error(exc)}
            continue
        views = [getattr(owner, attr, None) for owner, attr in unit.param_infos]
        # a view whose storage lacks its bytes must not be read: that can crash the process
        ok = [isinstance(v, torch.Tensor) and v.untyped_storage().nbytes() >= flat.element_size() * (
              v.storage_offset() + v.numel()) for v in views]
        got.update(ops=[(r.op, r.payload_bytes) for r in ledger.records], same=unit.flat is flat,
                   flat_bytes=flat.untyped_storage().nbytes(), views=[v.detach().clone() if o else None
                                                                      for v, o in zip(views, ok)],
                   dtypes=[str(v.dtype) if o else None for v, o in zip(views, ok)],
                   linked=[o and v.grad_fn is not None and v.untyped_storage().data_ptr() ==
                           flat.untyped_storage().data_ptr() for v, o in zip(views, ok)], error=None)
        try:  # forward, post_forward's free, pre_backward's second unshard, backward through what forward saved
            loss = module(x).square().sum()
            flat.untyped_storage().resize_(0)
            unit.unshard()
            loss.backward()
            got["flat_grad"] = flat.grad
        except Exception as exc:  # noqa: BLE001 - reported by the check
            got["error"] = _error(exc)
        out[case] = got
    return out


def _r82(ns):
    cls, fn = _method(ns, "unshard")
    return _results("8.2", (fn, definitions(ns)), _unshard_on_rank, (WORLD_SIZE,), cls)


@public_check("8.2")
def views_equal_the_original_parameters(ns):
    for where, n, rank, got, size in _each(_r82(ns)):
        start = 0
        for name, view, shape in zip(got["names"], got["views"], got["shapes"]):
            stop = start + math.prod(shape)
            expected = got["original"][start:stop].view(shape)
            assert view is not None and view.shape == shape and torch.equal(view, expected), (
                f"{where}: after unshard, {name} is "
                f"{'missing, or without bytes' if view is None else _head(view)}; expected "
                f"flat[{start}:{stop}] shaped {shape}, starting {_head(expected)}. Rank r's shard "
                f"lands at offset r x {size} of self.flat, and the views follow param_infos, the padding last")
            start = stop


@public_check("8.2")
def one_all_gather_into_flat_and_autograd_views(ns):
    for where, n, rank, got, size in _each(_r82(ns)):
        expected = [("all_gather", 4 * size * n)]
        assert got["ops"] == expected and got["same"] and got["flat_bytes"] == 4 * size * n, (
            f"{where}: the ledger shows {got['ops']} (op, bytes); self.flat is the same tensor: {got['same']}, "
            f"holding {got['flat_bytes']} bytes. Expected {expected}, one dist.all_gather_single into self.flat's "
            f"storage resized to {4 * size * n} bytes, the same tensor (the hooks are registered on it)")
        bad = [name for name, linked in zip(got["names"], got["linked"]) if not linked]
        assert not bad, (f"{where}: {bad} are not views of self.flat made with autograd: split self.flat itself (not "
                         "a copy, not under torch.no_grad()) so that their gradients accumulate into flat.grad")


@public_check("8.2")
def gradients_reach_flat_grad_after_a_second_unshard(ns):
    for where, n, rank, got, size in _each(_r82(ns)):
        hint = (" Write the gathered values through self.flat.data: an in-place write into self.flat bumps the "
                "version counter of the views autograd saved" if "inplace" in (got["error"] or "") else "")
        assert got["error"] is None, f"{where}: forward, free, unshard again, backward failed: {got['error']}.{hint}"
        assert got["flat_grad"] is not None, (
            f"{where}: after backward, flat.grad is None: no gradient reached self.flat, so the views are not linked "
            "to it by autograd; split self.flat itself, not under torch.no_grad() and not detached")
        assert _diff(got["flat_grad"], got["grad"]) < TOL, (
            f"{where}: after backward, flat.grad is not the gradient of the unit's parameters in flat order, with "
            "zeros at the padding")


@public_check("8.2")
def gathers_in_param_dtype(ns):
    for where, n, rank, got, size in _each(_r82(ns), mixed=True):
        assert "unshard_error" not in got, (
            f"{where}: unshard raised {got.get('unshard_error')}: all-gather flat_shard cast to param_dtype "
            "(self.flat_shard.data.to(self.param_dtype)) into self.flat.data, which is in param_dtype")
        expected = [("all_gather", 2 * size * n)]
        assert got["ops"] == expected, (
            f"{where}: the ledger shows {got['ops']} (op, bytes); expected {expected}, half of float32's bytes: cast "
            "flat_shard to param_dtype BEFORE the all-gather (self.flat_shard.data.to(self.param_dtype))")
        bad = [name for name, dtype in zip(got["names"], got["dtypes"]) if dtype != "torch.bfloat16"]
        assert not bad, f"{where}: after unshard, {bad} are not bfloat16 views of self.flat (param_dtype)"
        start = 0
        for name, view, shape in zip(got["names"], got["views"], got["shapes"]):
            stop = start + math.prod(shape)
            assert torch.equal(view, got["original"][start:stop].view(shape)), (
                f"{where}: after unshard, {name} is not the original parameter rounded to bfloat16")
            start = stop
        assert got["error"] is None and got["flat_grad"] is not None, (
            f"{where}: forward, free, unshard again, backward in bfloat16: {got['error'] or 'flat.grad is None'}")
        assert got["flat_grad"].dtype == BF16 and _diff(got["flat_grad"], got["grad"]) < TOL, (
            f"{where}: after backward, flat.grad ({got['flat_grad'].dtype}) is not the bfloat16 gradient of the "
            "unit's parameters in flat order")
