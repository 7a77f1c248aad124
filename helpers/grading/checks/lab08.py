"""Public checks of lab 08 (ZeRO-3 / FSDP from scratch): the sharded unit (FlatShard's __init__, unshard, reshard,
reduce_scatter_grads) and the training loop around it, proved against torch DDP + SGD at world sizes 2, 3 and 4.

8.2 to 8.4 build their unit with the reference layout `_ref_init`, not the student's __init__, so that each method is
checked on its own. No unit divides evenly: the nested block has 47 parameters (one padding zero on 3 and 4 ranks),
Linear(1, 1) has 2 (on 3 ranks the last shard is padding only). One launch per world size serves all the checks of a
question; its result is kept, keyed by the student's functions, until they are redefined.
"""
import collections
import math

import torch
import torch.distributed as dist
from torch import nn

from helpers.comm import CommLedger
from helpers.errors import CollectiveHang, RankFailed
from helpers.grading.registry import answer, public_check
from helpers.launch import launch
from helpers.memory import state_bytes

WORLD_SIZE = 3  # 8.2 to 8.4; 8.1 also runs on 4 ranks, 8.5 on 2, 3 and 4
HANG_S = 20.0  # a check whose ranks wait longer than this reports CollectiveHang instead of hanging
# float32 sums of the same numbers in another order differ by a few roundings of 2**-24 (chapter 08, section 5); SGD,
# unlike Adam, does not amplify that, so it stays far below 1e-6, and any real bug is far above.
TOL = 1e-6

_memo = {}  # question -> (key, (ok, value)) of the last launches for that question


def _results(question, key, fn, world_sizes, *args):
    """{world size: [rank results]} of fn(*args), launched once per key; a failure is re-raised by every check."""
    if question not in _memo or _memo[question][0] != key:
        try:
            outcome = True, {n: launch(fn, n, args=args, backend="gloo", hang_timeout=HANG_S) for n in world_sizes}
        except (CollectiveHang, RankFailed) as exc:
            if isinstance(exc, RankFailed) and exc.exitcode is None:
                outcome = False, exc  # an exception in the student's code: its own message is the best report
            else:
                outcome = False, AssertionError(
                    "the ranks did not finish together: every rank must issue the same collectives, with tensors of "
                    f"the same sizes. Launcher's report: {exc}")
        except Exception as exc:  # noqa: BLE001 - every check of the question reports the same failure
            outcome = False, exc
        _memo[question] = (key, outcome)
    ok, value = _memo[question][1]
    if not ok:
        raise value
    return value


def _method(ns, name):
    cls = answer(ns, "FlatShard")
    assert callable(getattr(cls, name, None)), f"FlatShard has no method `{name}`: run the cell that defines it"
    return cls, getattr(cls, name)


def _each(results):
    """(where, n, rank, got, s) for every world size n, rank and unit; s = elements per shard."""
    for n, ranks in results.items():
        for rank, result in enumerate(ranks):
            for case, got in result.items():
                where = f"{case} unit ({got['numel']} parameters), rank {rank} of {n}"
                yield where, n, rank, got, -(-got["numel"] // n)


def _flat(tensors):
    return torch.cat([t.detach().reshape(-1) for t in tensors])


def _padded(flat, n):
    return torch.cat([flat, flat.new_zeros(-flat.numel() % n)])


def _diff(a, b):
    return (a.double() - b.double()).abs().max().item()


def _head(t):
    """The first elements of t, rounded: enough to see a wrong order in a message."""
    return [round(v, 4) for v in t.reshape(-1)[:4].tolist()]


def _error(exc):
    if isinstance(exc, NotImplementedError):
        raise exc
    return f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"


# --- the units of 8.1 to 8.4, and the reference layout -----------------------------------------------------------

def _block():
    """A nested unit: Linear(5, 4), LayerNorm(4), Tanh, Linear(4, 3): 47 parameters, all random."""
    torch.manual_seed(8)
    block = nn.Sequential(nn.Linear(5, 4), nn.LayerNorm(4), nn.Tanh(), nn.Linear(4, 3))
    for p in block.parameters():
        nn.init.normal_(p)
    return block


def _tiny():
    torch.manual_seed(9)
    return nn.Linear(1, 1)


UNITS = {"block": (_block, 5), "tiny": (_tiny, 1)}  # name -> (maker, input features)


def _ref_init(unit, module):
    """The layout 8.1 asks for, written onto `unit`, an instance of the student's class made without __init__."""
    rank, n = dist.get_rank(), dist.get_world_size()
    named = [(k.rpartition("."), p) for k, p in module.named_parameters() if not k.endswith("flat_shard")]
    unit.module, unit.param_infos = module, [(module.get_submodule(prefix), attr) for (prefix, _, attr), _ in named]
    unit.shapes, unit.numels = [p.shape for _, p in named], [p.numel() for _, p in named]
    unit.numel, size = sum(unit.numels), -(-sum(unit.numels) // n)
    unit.padded_numel = size * n
    flat = _padded(_flat(p for _, p in named), n)
    unit.flat_shard = nn.Parameter(flat[rank * size : (rank + 1) * size].clone())
    for owner, attr in unit.param_infos:
        delattr(owner, attr)
    module.register_parameter("flat_shard", unit.flat_shard)
    unit.flat = torch.zeros_like(flat, requires_grad=True)
    unit.flat.untyped_storage().resize_(0)
    return unit


def _ref_unshard(unit):
    unit.flat.untyped_storage().resize_(4 * unit.padded_numel)
    dist.all_gather_single(unit.flat.data, unit.flat_shard.data)
    views = unit.flat.split(unit.numels + [unit.padded_numel - unit.numel])
    for (owner, attr), view, shape in zip(unit.param_infos, views, unit.shapes):
        setattr(owner, attr, view.view(shape))


def _case(cls, make, features):
    """(module, its unit by _ref_init, x, what a result holds: names, shapes, numel, the flat parameters and the
    padded flat gradient of (module(x)**2).sum())."""
    module, reference, n = make(), make(), dist.get_world_size()
    x = torch.randn(3, features, generator=torch.Generator().manual_seed(80))
    grads = torch.autograd.grad(reference(x).square().sum(), list(reference.parameters()))
    got = {"names": [k for k, _ in module.named_parameters()], "shapes": [tuple(p.shape) for p in module.parameters()],
           "original": _flat(module.parameters()), "grad": _padded(_flat(grads), n)}
    got["numel"] = got["original"].numel()
    return module, _ref_init(object.__new__(cls), module), x, got


# --- 8.1 FlatShard.__init__ --------------------------------------------------------------------------------------

def _init_on_rank(cls):
    out, root = {}, nn.Sequential(_block(), nn.Linear(3, 2))  # the root's unit takes the 8 parameters of root[1]
    for case, module in {"block": _block(), "tiny": _tiny(), "root": root}.items():
        if case == "root":
            cls(root[0])  # an inner unit, wrapped first
        named = [(k, p) for k, p in module.named_parameters() if not k.endswith("flat_shard")]
        where = {id(m): k for k, m in module.named_modules()}
        unit = cls(module)
        shard, flat = getattr(unit, "flat_shard", None), getattr(unit, "flat", None)
        infos = [f"{where.get(id(owner), '?')}.{attr}".lstrip(".") for owner, attr in getattr(unit, "param_infos", [])]
        out[case] = {
            "numel": sum(p.numel() for _, p in named), "original": _flat(p for _, p in named),
            "names": [k for k, _ in named], "shapes": [tuple(p.shape) for _, p in named],
            "layout": (getattr(unit, "numel", None), infos, [tuple(s) for s in getattr(unit, "shapes", [])],
                       getattr(unit, "numels", None), getattr(unit, "padded_numel", None)),
            "shard": shard.detach().clone() if isinstance(shard, torch.Tensor) else None,
            "registered": isinstance(shard, nn.Parameter) and module._parameters.get("flat_shard") is shard,
            "others": [k for k, p in module.named_parameters() if p is not shard and not k.endswith(".flat_shard")],
            "shard_bytes": shard.untyped_storage().nbytes() if isinstance(shard, torch.Tensor) else None,
            "flat": (tuple(flat.shape), flat.is_leaf and flat.requires_grad, flat.untyped_storage().nbytes())
            if isinstance(flat, torch.Tensor) else None}
    return out


def _r81(ns):
    cls = answer(ns, "FlatShard")
    return _results("8.1", (cls, cls.__dict__.get("__init__")), _init_on_rank, (3, 4), cls)


@public_check("8.1")
def shard_is_this_ranks_piece_of_the_padded_flat(ns):
    for where, n, rank, got, size in _each(_r81(ns)):
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


# --- 8.2 unshard --------------------------------------------------------------------------------------------------

def _unshard_on_rank(cls):
    out = {}
    for case, (make, features) in UNITS.items():
        module, unit, x, got = _case(cls, make, features)
        flat = unit.flat
        with CommLedger() as ledger:
            unit.unshard()
        views = [getattr(owner, attr, None) for owner, attr in unit.param_infos]
        # a view whose storage lacks its bytes must not be read: that can crash the process
        ok = [isinstance(v, torch.Tensor) and v.untyped_storage().nbytes() >= 4 * (v.storage_offset() + v.numel())
              for v in views]
        got.update(ops=[(r.op, r.payload_bytes) for r in ledger.records], same=unit.flat is flat,
                   flat_bytes=flat.untyped_storage().nbytes(), views=[v.detach().clone() if o else None
                                                                      for v, o in zip(views, ok)],
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
    return _results("8.2", fn, _unshard_on_rank, (WORLD_SIZE,), cls)


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
        assert got["flat_grad"] is not None and _diff(got["flat_grad"], got["grad"]) < TOL, (
            f"{where}: after backward, flat.grad is not the gradient of the unit's parameters in flat order, with "
            "zeros at the padding")


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
    return _results("8.3", fn, _reshard_on_rank, (WORLD_SIZE,), cls)


@public_check("8.3")
def frees_the_full_parameters(ns):
    for where, n, rank, got, size in _each(_r83(ns)):
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


# --- 8.4 reduce_scatter_grads -------------------------------------------------------------------------------------

def _local_grad(rank, padded, numel, call):
    """Rank's flat.grad in call `call`: random, zeros at the padding (as backward through the views leaves it)."""
    grad = torch.randn(padded, generator=torch.Generator().manual_seed(100 * call + rank))
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
    return out


def _r84(ns):
    cls, fn = _method(ns, "reduce_scatter_grads")
    return _results("8.4", fn, _reduce_on_rank, (WORLD_SIZE,), cls)


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


# --- 8.5 train_fsdp -----------------------------------------------------------------------------------------------

D, H, BATCH, STEPS, LR, MOMENTUM = 4, 6, 4, 3, 0.05, 0.9
UNIT_NAMES = ["body.0", "body.1"]  # 70 parameters each; the root keeps the head's 5


def _model():
    torch.manual_seed(5)
    body = [nn.Sequential(nn.Linear(D, H), nn.LayerNorm(H), nn.Tanh(), nn.Linear(H, D)) for _ in range(2)]
    return nn.Sequential(collections.OrderedDict(body=nn.Sequential(*body), head=nn.Linear(D, 1)))


def _unit_orders():
    """{unit name: the original parameter names it holds, in flat order}; "" is the root."""
    names = [k for k, _ in _model().named_parameters()]
    orders = {u: [k for k in names if k.startswith(u + ".")] for u in UNIT_NAMES}
    return {**orders, "": [k for k in names if not any(k.startswith(u + ".") for u in UNIT_NAMES)]}


def _train_on_rank(train):
    from torch.nn.parallel import DistributedDataParallel

    rank, n = dist.get_rank(), dist.get_world_size()
    generator = torch.Generator().manual_seed(50 + rank)  # different data on every rank
    batches = [(torch.randn(BATCH, D, generator=generator), torch.randn(BATCH, 1, generator=generator))
               for _ in range(STEPS)]
    model = _model()
    with CommLedger() as ledger:
        units = train(model, list(UNIT_NAMES), batches, lr=LR, momentum=MOMENTUM)
    modules, full = dict(model.named_modules()), {}
    for name in _unit_orders():  # every unit's parameters, all-gathered from the shards
        shard = modules[name]._parameters.get("flat_shard")
        if shard is not None:
            full[name] = shard.new_empty(n * shard.numel())
            dist.all_gather_single(full[name], shard.detach())
    flats = [getattr(u, "flat", None) for u in units] if isinstance(units, (list, tuple)) else [None]
    held = state_bytes(model, extra={"unsharded": flats}) if all(isinstance(f, torch.Tensor) for f in flats) else None
    reference = DistributedDataParallel(_model())
    optimizer = torch.optim.SGD(reference.parameters(), lr=LR, momentum=MOMENTUM)
    for x, y in batches:
        optimizer.zero_grad()
        nn.functional.mse_loss(reference(x), y).backward()
        optimizer.step()
    return {"full": full, "ddp": {k: p.detach().clone() for k, p in reference.module.named_parameters()},
            "ops": sorted((r.op, r.payload_bytes) for r in ledger.records), "held": held}


def _r85(ns):
    cls = answer(ns, "FlatShard")
    methods = ("__init__", "unshard", "reshard", "reduce_scatter_grads", "register_hooks")
    key = (answer(ns, "train_fsdp"), *(cls.__dict__.get(m) for m in methods))
    return _results("8.5", key, _train_on_rank, (2, 3, 4), key[0])


def _units(ns):
    """(n, ranks, name, label, DDP's parameters of that unit, flat) for every world size and unit."""
    for n, ranks in _r85(ns).items():
        for name, order in _unit_orders().items():
            label = repr(name) if name else "root"
            assert name in ranks[0]["full"], (
                f"N={n}: the {label} module has no flat_shard after train_fsdp: make a unit of every module in "
                "unit_names, then of the root (FlatShard(model)), which takes the parameters left")
            yield n, ranks, name, label, _flat(ranks[0]["ddp"][k] for k in order)


@public_check("8.5")
def identical_on_every_rank_despite_different_data(ns):
    for n, ranks, name, label, _ in _units(ns):
        for rank in range(1, n):
            diff = _diff(ranks[rank]["full"][name], ranks[0]["full"][name])
            assert diff == 0, (f"N={n}: after {STEPS} steps on different data, rank {rank}'s {label} unit differs from "
                               f"rank 0's by {diff:.3g}: every rank must step its shard with the MEAN gradient")


@public_check("8.5")
def equals_torch_ddp_with_sgd(ns):
    for n, ranks, name, label, expected in _units(ns):
        got = ranks[0]["full"][name][: expected.numel()]
        assert _diff(got, expected) < TOL, (
            f"N={n}: after {STEPS} steps the {label} unit differs from torch DDP + SGD(lr={LR}, momentum={MOMENTUM}) "
            f"by {_diff(got, expected):.3g} (tolerance {TOL:g}). Check: units bottom-up (unit_names, then the root), "
            "hooks on every unit, the optimizer built AFTER sharding, zero_grad every step, the mean MSE loss")


@public_check("8.5")
def two_all_gathers_and_one_reduce_scatter_per_unit_and_step(ns):
    for n, ranks in _r85(ns).items():
        padded = [4 * -(-sum(ranks[0]["ddp"][k].numel() for k in o) // n) * n for o in _unit_orders().values()]
        expected = sorted([("all_gather", b) for b in padded * 2 * STEPS]
                          + [("reduce_scatter", b) for b in padded * STEPS])
        for rank, result in enumerate(ranks):
            assert result["ops"] == expected, (
                f"N={n}, rank {rank}: {STEPS} steps issued {dict(collections.Counter(result['ops']))} (op, bytes); "
                f"expected per step and unit (padded bytes {padded}) two all_gathers (forward, backward) and one "
                "reduce_scatter: 3 Psi, 1.5x DDP")


@public_check("8.5")
def only_shards_held_between_steps(ns):
    for n, ranks in _r85(ns).items():
        shards = sum(4 * -(-sum(ranks[0]["ddp"][k].numel() for k in o) // n) for o in _unit_orders().values())
        for rank, result in enumerate(ranks):
            assert result["held"] is not None, f"N={n}: train_fsdp should return its units (FlatShard objects)"
            got = tuple(result["held"][k] for k in ("params", "grads", "unsharded"))
            assert got == (shards, shards, 0), (
                f"N={n}, rank {rank}: after training the rank holds (params, grads, unsharded) = {got} bytes; expected "
                f"({shards}, {shards}, 0): only the shards and their gradients, every unit resharded")
