"""Checks of lab 8.3: FlatShard.reshard frees the full parameters' storage, removes the views, keeps self.flat."""
from helpers.comm import CommLedger
from helpers.grading.checks.lab08.common import (
    TOL,
    UNITS,
    WORLD_SIZE,
    _case,
    _diff,
    _each,
    _error,
    _method,
    _ref_unshard,
    _results,
)
from helpers.grading.registry import public_check
from helpers.grading.shared_run import definitions

# --- 8.3 reshard --------------------------------------------------------------------------------------------------

def _reshard_on_rank(cls):
    out = {}
    for case, (make, features) in UNITS.items():
        module, unit, x, got = _case(cls, make, features)
        flat, errors = unit.flat, []
        try:
            unit.reshard()
        except Exception as exc:  # noqa: BLE001 - reported by the check
            errors.append(f"before any unshard: {_error(exc)}")
        _ref_unshard(unit)
        views = [getattr(owner, attr) for owner, attr in unit.param_infos]
        loss = module(x).square().sum()  # autograd saves the views it needs for backward
        with CommLedger() as ledger:
            unit.reshard()
        got.update(ops=[r.op for r in ledger.records], flat_bytes=flat.untyped_storage().nbytes(),
                   view_bytes=max(v.untyped_storage().nbytes() for v in views), same=unit.flat is flat,
                   left=[k for k, (owner, attr) in zip(got["names"], unit.param_infos) if hasattr(owner, attr)])
        try:
            unit.reshard()
        except Exception as exc:  # noqa: BLE001
            errors.append(f"a second time: {_error(exc)}")
        got.update(errors=errors, grad_ok=False)
        if got["same"]:  # the next unshard refills the same storage: backward must work through what forward saved
            _ref_unshard(unit)
            loss.backward()
            got["grad_ok"] = flat.grad is not None and _diff(flat.grad, got["grad"]) < TOL
        out[case] = got
    return out


def _r83(ns):
    cls, fn = _method(ns, "reshard")
    return _results("8.3", (fn, definitions(ns)), _reshard_on_rank, (WORLD_SIZE,), cls)


@public_check("8.3")
def frees_the_full_parameters(ns):
    for where, n, rank, got, size in _each(_r83(ns)):
        assert got["same"], (
            f"{where}: reshard replaced self.flat by a new tensor; the views of the old one, which autograd saved "
            f"for backward, still hold {got['view_bytes']} bytes. Resize self.flat's own storage to 0 "
            "(untyped_storage().resize_(0)) and keep the tensor")
        assert got["flat_bytes"] == 0 and got["view_bytes"] == 0, (
            f"{where}: after reshard, self.flat holds {got['flat_bytes']} bytes and the views autograd saved for "
            f"backward {got['view_bytes']}; expected 0 and 0. Dropping references frees nothing while autograd holds "
            "the views: resize the storage they share to 0 bytes (untyped_storage().resize_(0))")
        assert got["ops"] == [], f"{where}: reshard issued {got['ops']}; expected no collective"


@public_check("8.3")
def removes_the_views_from_the_modules(ns):
    for where, n, rank, got, size in _each(_r83(ns)):
        assert not got["left"], (f"{where}: after reshard the modules still have {got['left']}; reading a view of "
                                 "freed storage can crash the process: delete them from their owners (delattr)")
        assert not got["errors"], (f"{where}: reshard raised {got['errors']}; when the unit is already sharded "
                                   "(its modules have no views) it must do nothing")


@public_check("8.3")
def keeps_flat_for_the_next_unshard(ns):
    for where, n, rank, got, size in _each(_r83(ns)):
        assert got["same"] and got["grad_ok"], (
            f"{where}: after reshard and a new unshard, backward did not put the right gradient in flat.grad "
            f"(self.flat still the same tensor: {got['same']}). Resize self.flat's storage, never replace the "
            "tensor: the views autograd saved and the hooks refer to it")
