"""Checks of lab 8.1: FlatShard.__init__, this rank's shard of the padded flat parameter, the layout, an empty flat,
and the compute and reduction dtypes (a bfloat16 flat, a float32 shard)."""
import math

import torch
from torch import nn

from helpers.grading.checks.lab08.common import (
    BF16,
    _block,
    _each,
    _error,
    _flat,
    _head,
    _padded,
    _results,
    _tiny,
)
from helpers.grading.registry import answer, public_check
from helpers.grading.shared_run import definitions

# --- 8.1 FlatShard.__init__ --------------------------------------------------------------------------------------

def _init_on_rank(cls):
    out, root = {}, nn.Sequential(_block(), nn.Linear(3, 2))  # the root's unit takes the 8 parameters of root[1]
    for case, module in {"block": _block(), "tiny": _tiny(), "root": root}.items():
        if case == "root":
            cls(root[0])  # an inner unit, wrapped first
        named = [(k, p) for k, p in module.named_parameters() if not k.endswith("flat_shard")]
        where = {id(m): k for k, m in module.named_modules()}
        with_inner = sum(p.numel() for p in module.parameters())  # inner units' flat_shard included
        unit = cls(module)
        shard, flat = getattr(unit, "flat_shard", None), getattr(unit, "flat", None)
        infos = [f"{where.get(id(owner), '?')}.{attr}".lstrip(".") for owner, attr in getattr(unit, "param_infos", [])]
        out[case] = {
            "numel": sum(p.numel() for _, p in named), "original": _flat(p for _, p in named),
            "with_inner": with_inner,
            "names": [k for k, _ in named], "shapes": [tuple(p.shape) for _, p in named],
            "layout": (getattr(unit, "numel", None), infos, [tuple(s) for s in getattr(unit, "shapes", [])],
                       getattr(unit, "numels", None), getattr(unit, "padded_numel", None)),
            "shard": shard.detach().clone() if isinstance(shard, torch.Tensor) else None,
            "registered": isinstance(shard, nn.Parameter) and module._parameters.get("flat_shard") is shard,
            "others": [k for k, p in module.named_parameters() if p is not shard and not k.endswith(".flat_shard")],
            "shard_bytes": shard.untyped_storage().nbytes() if isinstance(shard, torch.Tensor) else None,
            "flat": (tuple(flat.shape), flat.is_leaf and flat.requires_grad, flat.untyped_storage().nbytes())
            if isinstance(flat, torch.Tensor) else None,
            "dtypes": (str(getattr(unit, "param_dtype", None)), str(getattr(unit, "reduce_dtype", None)))}
    out["bfloat16 block"] = _mixed_init(cls, BF16, None)
    out["bfloat16 block (float32 reduction)"] = _mixed_init(cls, BF16, torch.float32)
    return out


def _mixed_init(cls, param_dtype, reduce_dtype):
    """What FlatShard(block, param_dtype=..., reduce_dtype=...) recorded; its error, if it raised."""
    module = _block()
    got = {"mixed": True, "numel": sum(p.numel() for p in module.parameters()), "original": _flat(module.parameters()),
           "want": (str(param_dtype), str(reduce_dtype or param_dtype)), "error": None}
    try:
        unit = cls(module, param_dtype=param_dtype, reduce_dtype=reduce_dtype)
    except Exception as exc:  # noqa: BLE001 - reported by the check
        got["error"] = _error(exc)
        return got
    flat, shard = getattr(unit, "flat", None), getattr(unit, "flat_shard", None)
    got.update(dtypes=(str(getattr(unit, "param_dtype", None)), str(getattr(unit, "reduce_dtype", None))),
               flat=(str(flat.dtype), tuple(flat.shape), flat.untyped_storage().nbytes())
               if isinstance(flat, torch.Tensor) else None,
               shard=shard.detach().clone() if isinstance(shard, torch.Tensor) else None)
    return got


def _r81(ns):
    cls = answer(ns, "FlatShard")
    return _results("8.1", (cls.__dict__.get("__init__"), definitions(ns)), _init_on_rank, (3, 4), cls)


@public_check("8.1")
def shard_is_this_ranks_piece_of_the_padded_flat(ns):
    for where, n, rank, got, size in _each(_r81(ns)):
        inner = -(-got["with_inner"] // n)
        if got["shard"] is not None and got["shard"].shape == (inner,) != (size,):
            raise AssertionError(
                f"{where}: flat_shard has {inner} elements, ceil({got['with_inner']} / {n}): the unit took an inner "
                f"unit's flat_shard (already sharded) into its flat parameter; skip the parameters named "
                f"flat_shard, and the shard has ceil({got['numel']} / {n}) = {size} elements")
        assert got["shard"] is not None and got["shard"].shape == (size,), (
            f"{where}: flat_shard is {tuple(getattr(got['shard'], 'shape', ()))}; expected ({size},), "
            f"ceil({got['numel']} / {n}) elements. Pad the flat parameter with zeros at its end to {size * n} "
            "elements first (torch.chunk does not pad: its shards are unequal, or missing)")
        expected = _padded(got["original"], n)[rank * size : (rank + 1) * size]
        assert torch.equal(got["shard"], expected), (
            f"{where}: flat_shard is {_head(got['shard'])}...; expected elements [{rank * size}, {(rank + 1) * size}) "
            f"of the flat parameter (named_parameters order, zeros after the last real one): {_head(expected)}...")


@public_check("8.1")
def the_shard_is_the_units_only_parameter(ns):
    for where, n, rank, got, size in _each(_r81(ns)):
        assert got["registered"] and not got["others"], (
            f"{where}: flat_shard registered on the module as an nn.Parameter: {got['registered']}; other "
            f"parameters left: {got['others']}. Expected flat_shard only (register_parameter), the originals deleted "
            "from the modules that own them")
        assert got["shard_bytes"] == 4 * size, (
            f"{where}: flat_shard's storage holds {got['shard_bytes']} bytes; expected 4 x {size} = {4 * size}, "
            "storage of its own: clone() the slice, which otherwise keeps the whole flat buffer alive")


@public_check("8.1")
def layout_recorded_in_named_parameters_order(ns):
    for where, n, rank, got, size in _each(_r81(ns)):
        expected = (got["numel"], got["names"], got["shapes"], [math.prod(s) for s in got["shapes"]], size * n)
        assert got["layout"] == expected, (
            f"{where}: (numel, param_infos as names, shapes, numels, padded_numel) is {got['layout']}; expected "
            f"{expected}. param_infos holds (owner module, attribute name) pairs; skip the parameters named "
            "flat_shard, which inner units registered (after FlatShard(root[0]), FlatShard(root) takes root[1]'s)")


@public_check("8.1")
def unsharded_buffer_holds_no_bytes(ns):
    for where, n, rank, got, size in _each(_r81(ns)):
        expected = ((size * n,), True, 0)
        assert got["flat"] == expected, (
            f"{where}: self.flat is (shape, leaf with requires_grad, storage bytes) {got['flat']}; expected "
            f"{expected}: it exists with its shape but holds no memory until unshard() (untyped_storage().resize_(0))")


@public_check("8.1")
def flat_in_param_dtype_the_shard_stays_float32(ns):
    results = _r81(ns)
    for where, n, rank, got, size in _each(results):
        assert got["dtypes"] == ("torch.float32", "torch.float32"), (
            f"{where}: FlatShard(module) records (param_dtype, reduce_dtype) = {got['dtypes']}; expected "
            "('torch.float32', 'torch.float32'): param_dtype None stands for the parameters' own dtype, and "
            "reduce_dtype None for param_dtype")
    for where, n, rank, got, size in _each(results, mixed=True):
        assert got["error"] is None, (f"{where}: FlatShard(module, param_dtype={got['want'][0]}, reduce_dtype=...) "
                                      f"raised {got['error']}; __init__ takes param_dtype=None, reduce_dtype=None")
        assert got["dtypes"] == got["want"], (
            f"{where}: (param_dtype, reduce_dtype) = {got['dtypes']}; expected {got['want']}" + (
                ": reduce_dtype None means the compute dtype (FSDP2 reduces in the dtype the gradients arrive in), "
                "not float32" if got["dtypes"][1] == "torch.float32" else ""))
        expected = _padded(got["original"], n)[rank * size : (rank + 1) * size]
        shard = got["shard"]
        assert shard is not None and shard.dtype == torch.float32 and torch.equal(shard, expected), (
            f"{where}: flat_shard is {getattr(got['shard'], 'dtype', None)}, {_head(got['shard'])}...; expected the "
            "float32 shard of the original parameters: the shard stays in the parameters' own dtype, the master copy "
            "the optimizer steps; only the unsharded flat is in param_dtype")
        want = (got["want"][0], (size * n,), 0)
        assert got["flat"] == want, (
            f"{where}: self.flat is (dtype, shape, storage bytes) {got['flat']}; expected {want}: the unsharded buffer "
            "is the compute copy, in param_dtype (zeros_like(flat, dtype=...)), holding 0 bytes until unshard()")
