"""Checks of lab 8.5: train_fsdp equals torch DDP + SGD on 2, 3 and 4 ranks and holds only shards between steps; with
its blocks given by type and a bfloat16 compute dtype, it equals FSDP2 with MixedPrecisionPolicy on 2 ranks; a unit type
that no submodule has is a ValueError that names it."""
import collections

import torch
import torch.distributed as dist
from torch import nn

from helpers.comm import CommLedger
from helpers.errors import RankFailed
from helpers.grading.checks.lab08 import common
from helpers.grading.checks.lab08.common import (
    BF16,
    TOL,
    _diff,
    _error,
    _flat,
    _results,
)
from helpers.grading.registry import answer, public_check
from helpers.grading.shared_run import definitions, run_failed
from helpers.memory import state_bytes

# --- 8.5 train_fsdp -----------------------------------------------------------------------------------------------

D, H, BATCH, STEPS, LR, MOMENTUM = 4, 6, 4, 3, 0.05, 0.9
UNIT_NAMES = ["body.0", "body.1"]  # 70 parameters each; the root keeps the head's 5
MIXED_N = 2  # the bfloat16 run's world size: a sum of 2 gradients is one rounding in any order, so FSDP2 agrees to TOL


class Block(nn.Sequential):
    """The blocks' own type, so that units=(Block,) finds them (body, an nn.Sequential too, is not one)."""


def _model():
    torch.manual_seed(5 + common.OFFSET)
    body = [Block(nn.Linear(D, H), nn.LayerNorm(H), nn.Tanh(), nn.Linear(H, D)) for _ in range(2)]
    return nn.Sequential(collections.OrderedDict(body=nn.Sequential(*body), head=nn.Linear(D, 1)))


def _unit_orders():
    """{unit name: the original parameter names it holds, in flat order}; "" is the root."""
    names = [k for k, _ in _model().named_parameters()]
    orders = {u: [k for k in names if k.startswith(u + ".")] for u in UNIT_NAMES}
    return {**orders, "": [k for k in names if not any(k.startswith(u + ".") for u in UNIT_NAMES)]}


def _batches():
    generator = torch.Generator().manual_seed(50 + dist.get_rank() + 10 * common.OFFSET)  # different on every rank
    return [(torch.randn(BATCH, D, generator=generator), torch.randn(BATCH, 1, generator=generator))
            for _ in range(STEPS)]


def _gathered(model):
    """{unit name: its parameters, all-gathered from the shards} for the units that have a flat_shard."""
    modules, full, n = dict(model.named_modules()), {}, dist.get_world_size()
    for name in _unit_orders():
        shard = modules[name]._parameters.get("flat_shard")
        if shard is not None:
            full[name] = shard.new_empty(n * shard.numel())
            dist.all_gather_single(full[name], shard.detach())
    return full


def _train_on_rank(train):
    from torch.nn.parallel import DistributedDataParallel

    batches, model = _batches(), _model()
    with CommLedger() as ledger:
        units = train(model, list(UNIT_NAMES), batches, lr=LR, momentum=MOMENTUM)
    full = _gathered(model)
    flats = [getattr(u, "flat", None) for u in units] if isinstance(units, (list, tuple)) else [None]
    held = state_bytes(model, extra={"unsharded": flats}) if all(isinstance(f, torch.Tensor) for f in flats) else None
    mixed = _mixed_on_rank(train) if dist.get_world_size() == MIXED_N else None
    nowhere = _nowhere_on_rank(train) if dist.get_world_size() == MIXED_N else None
    reference = DistributedDataParallel(_model())
    optimizer = torch.optim.SGD(reference.parameters(), lr=LR, momentum=MOMENTUM)
    for x, y in batches:
        optimizer.zero_grad()
        nn.functional.mse_loss(reference(x), y).backward()
        optimizer.step()
    return {"full": full, "ddp": {k: p.detach().clone() for k, p in reference.module.named_parameters()},
            "ops": sorted((r.op, r.payload_bytes) for r in ledger.records), "held": held, "mixed": mixed,
            "nowhere": nowhere}


class Absent(nn.Module):
    """A module type that the checks' model does not hold."""


def _nowhere_on_rank(train):
    """What train_fsdp does with a unit type that no submodule has: (exception type, message), or None."""
    try:
        train(_model(), (Absent,), [], lr=LR, momentum=MOMENTUM)
    except Exception as exc:  # noqa: BLE001 - reported by the check
        return type(exc).__name__, str(exc)
    return None


def _mixed_on_rank(train):
    """The blocks given by type, bfloat16 compute: the student's run and FSDP2's with MixedPrecisionPolicy."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    batches, model, got = _batches(), _model(), {"error": None}
    try:
        with CommLedger() as ledger:
            train(model, (Block,), batches, lr=LR, momentum=MOMENTUM, param_dtype=BF16)
    except Exception as exc:  # noqa: BLE001 - reported by the check
        got["error"] = _error(exc)
        return got
    got.update(full=_gathered(model), ops=sorted((r.op, r.payload_bytes) for r in ledger.records))
    reference, policy = _model(), MixedPrecisionPolicy(param_dtype=BF16)
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    for module in [*(m for m in reference.modules() if isinstance(m, Block)), reference]:
        fully_shard(module, mesh=mesh, mp_policy=policy)
    optimizer = torch.optim.SGD(reference.parameters(), lr=LR, momentum=MOMENTUM)
    for x, y in batches:
        optimizer.zero_grad()
        nn.functional.mse_loss(reference(x).float(), y).backward()
        optimizer.step()
    got["fsdp2"] = {k: p.full_tensor().detach() for k, p in reference.named_parameters()}
    return got


_explained = {}  # id(a rank's exception) -> the failure that names its likely cause, so it is reported once
# torch's error of a forward that found no parameter on a module, and what it means (the grader says it too)
NO_PARAMETER = "object has no attribute"
NO_HOOKS = ("a module had no parameter during forward: a unit deletes the originals and only its hooks put views back; "
            "call register_hooks() on every unit before training. ")


def _r85(ns):
    cls = answer(ns, "FlatShard")
    methods = ("__init__", "unshard", "reshard", "reduce_scatter_grads", "register_hooks")
    key = (answer(ns, "train_fsdp"), *(cls.__dict__.get(m) for m in methods))
    try:
        return _results("8.5", (*key, definitions(ns)), _train_on_rank, (2, 3, 4), key[0])
    except RankFailed as exc:
        if NO_PARAMETER not in str(exc):
            raise
        # the units deleted the original parameters; only pre_forward's unshard puts views back
        if id(exc) not in _explained:
            _explained[id(exc)] = run_failed(exc, NO_HOOKS)
        raise _explained[id(exc)] from None


def _one_process(n, zero_grad=True):
    """{name: parameter} after SGD in one process on the n ranks' batches together (equal sizes: DDP's mean)."""
    model = _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    generators = [torch.Generator().manual_seed(50 + rank + 10 * common.OFFSET) for rank in range(n)]
    batches = [[(torch.randn(BATCH, D, generator=g), torch.randn(BATCH, 1, generator=g)) for _ in range(STEPS)]
               for g in generators]
    for step in range(STEPS):
        x, y = (torch.cat(parts) for parts in zip(*(b[step] for b in batches)))
        if zero_grad:
            optimizer.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()
    return {k: p.detach() for k, p in model.named_parameters()}


def _diagnose(n, name, got):
    """Why a unit's parameters differ from DDP's, when the cause is a common one; or ''."""
    order = _unit_orders()[name]
    initial = _flat(dict(_model().named_parameters())[k] for k in order)
    if _diff(got, initial) == 0:
        return (f" Its parameters never changed in {STEPS} steps: the optimizer holds the original parameters, "
                "which the units replaced; build the optimizer AFTER the units, over model.parameters() (the shards)")
    if _diff(got, _flat(_one_process(n, zero_grad=False)[k] for k in order)) < 1e-5:
        return (" They equal SGD whose gradients accumulate across steps (no zero_grad): call "
                "optimizer.zero_grad() at the start of every step")
    return ""


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
            f"by {_diff(got, expected):.3g} (tolerance {TOL:g})." + (_diagnose(n, name, got) or (
                " Check: units bottom-up (unit_names, then the root), hooks on every unit, the optimizer built "
                "AFTER sharding, zero_grad every step, the mean MSE loss")))


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


def _mixed(ns):
    """(n, rank 0's mixed run) after the float32 runs; the run's error, if any, as the failure."""
    ranks = _r85(ns)[MIXED_N]
    got = ranks[0]["mixed"]
    error = got["error"] or ""
    hint = (" units may hold module types: every submodule of that type is a unit (isinstance), the model excepted"
            if "Block" in error else " train_fsdp takes param_dtype=None and reduce_dtype=None, for every unit"
            if "dtype" in error else "")
    assert got["error"] is None, (f"N={MIXED_N}: train_fsdp(model, (Block,), batches, lr=..., momentum=..., "
                                  f"param_dtype=torch.bfloat16) raised {got['error']}.{hint}")
    return ranks, got


@public_check("8.5")
def blocks_by_type_in_bfloat16_equal_fsdp2_mixed_precision(ns):
    ranks, got = _mixed(ns)
    for name, order in _unit_orders().items():
        label = repr(name) if name else "root"
        assert name in got["full"], (
            f"N={MIXED_N}, units=(Block,): the {label} module has no flat_shard: a type stands for every submodule "
            "of that type (for m in model.modules(): if isinstance(m, Block)), then the root takes what is left")
        for rank in range(1, MIXED_N):
            assert torch.equal(ranks[rank]["mixed"]["full"][name], got["full"][name]), (
                f"N={MIXED_N}, bfloat16: rank {rank}'s {label} unit differs from rank 0's")
        expected = _flat(got["fsdp2"][k] for k in order)
        diff = _diff(got["full"][name][: expected.numel()], expected)
        ddp = _flat(ranks[0]["ddp"][k] for k in order)
        hint = (" It equals the float32 run: pass param_dtype to every FlatShard, and compute in it"
                if _diff(got["full"][name][: ddp.numel()], ddp) < TOL else "")
        assert diff < TOL, (
            f"N={MIXED_N}, units=(Block,), param_dtype=torch.bfloat16: after {STEPS} steps the {label} unit differs "
            f"from FSDP2 with MixedPrecisionPolicy(param_dtype=torch.bfloat16) by {diff:.3g} "
            f"(tolerance {TOL:g}).{hint}")


@public_check("8.5")
def bfloat16_collectives_move_half_the_bytes(ns):
    ranks, _ = _mixed(ns)
    padded = [2 * -(-sum(ranks[0]["ddp"][k].numel() for k in o) // MIXED_N) * MIXED_N for o in _unit_orders().values()]
    expected = sorted([("all_gather", b) for b in padded * 2 * STEPS] + [("reduce_scatter", b) for b in padded * STEPS])
    for rank, result in enumerate(ranks):
        assert result["mixed"]["ops"] == expected, (
            f"N={MIXED_N}, rank {rank}, param_dtype=torch.bfloat16: {STEPS} steps issued "
            f"{dict(collections.Counter(result['mixed']['ops']))} (op, bytes); expected per step and unit (bytes "
            f"{padded}) two all_gathers and one reduce_scatter at 2 bytes per element: gather and reduce in bfloat16")


@public_check("8.5")
def a_unit_type_no_submodule_has_is_an_error(ns):
    kind, message = _r85(ns)[MIXED_N][0]["nowhere"] or (None, "")
    call = "train_fsdp(model, (Absent,), batches, lr=..., momentum=...), with a type no submodule of the model has,"
    assert kind is not None, (f"N={MIXED_N}: {call} returned: a wrong type would silently shard nothing. Raise "
                              "ValueError naming the type when no submodule is an instance of it")
    assert kind == "ValueError" and "Absent" in message, (
        f"N={MIXED_N}: {call} raised {kind}: {message}. Expected ValueError naming the type (Absent), raised before "
        "any unit is made")
