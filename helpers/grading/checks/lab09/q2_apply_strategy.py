"""Checks of lab 9.2: apply_strategy's DDP, ZeRO-2, FSDP and HSDP on 4 ranks, collectives against helpers.theory."""
import math

import torch.distributed as dist
import torch.nn.functional as F

from helpers import theory
from helpers.comm import CommLedger
from helpers.grading.checks.lab09.common import (
    DEPTH,
    OPS,
    WIDTH,
    Layer,
    make_net,
    num_params,
    padded_num_params,
    rank_batches,
    run_on_ranks,
)
from helpers.grading.registry import answer, public_check
from helpers.grading.shared_run import definitions


# ------------------------------------------------------------------------------------------------ question 9.2
def held(param):
    """Fraction of `param` this rank holds: 1.0 for a plain tensor, the local shard's share for a DTensor."""
    from torch.distributed.tensor import DTensor

    if isinstance(param, DTensor):
        return param.to_local().numel() / param.numel()
    return 1.0


def _on_ranks_apply(apply_strategy, strategies):
    """Apply each strategy to a fresh Net, run forward and backward under a ledger; report what happened."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import FSDPModule
    from torch.distributed.tensor import DTensor
    from torch.nn.parallel import DistributedDataParallel as DDP

    rank, n = dist.get_rank(), dist.get_world_size()
    meshes = {1: init_device_mesh("cpu", (n,))}
    if "hybrid_shard" in strategies:
        meshes[2] = init_device_mesh("cpu", (2, n // 2), mesh_dim_names=("replicate", "shard"))
    x, y = rank_batches(rank, 1)[0]
    report = {}
    for strategy in strategies:
        model = make_net()
        configured = apply_strategy(model, meshes[2 if strategy == "hybrid_shard" else 1], strategy, (Layer,))
        if configured is None:
            report[strategy] = {"error": "apply_strategy returned None: return the model to train"}
            continue
        inner = configured.module if isinstance(configured, DDP) else configured
        with CommLedger() as ledger:
            with ledger.tag("forward"):
                loss = F.mse_loss(configured(x), y)
            after_forward = {"root": held(inner.embed.weight), "layer": held(inner.layers[0].fc1.weight)}
            with ledger.tag("backward"):
                loss.backward()
        weight = inner.layers[0].fc1.weight
        report[strategy] = {
            "ddp": isinstance(configured, DDP),
            "units": sorted(name or "(root)" for name, m in inner.named_modules() if isinstance(m, FSDPModule)),
            "placements": str(weight.placements) if isinstance(weight, DTensor) else None,
            "after_forward": after_forward,
            "records": [(r.op, r.label, r.payload_bytes, r.group_size) for r in ledger.records]}
    return report


def _count(records, op, phase=None):
    return sum(1 for r in records if r[0] == op and (phase is None or r[1] == phase))


def _payload(records, op):
    return sum(r[2] for r in records if r[0] == op)


def _check_sharded(strategy, report, world_size, shards):
    """The ledger and the held fractions of one fully_shard strategy on rank 0."""
    model = make_net()
    units = DEPTH + 1
    where = f"{strategy} on {world_size} ranks"
    got_units = report["units"]
    assert got_units == sorted(["(root)"] + [f"layers.{i}" for i in range(DEPTH)]), (
        f"{where}: the FSDP units are {got_units}; expected one per Layer (block_types) and the root: call "
        "fully_shard on every module of a block type first (deepest first), then on the root")
    records = report["records"]
    forward, backward = _count(records, "all_gather", "forward"), _count(records, "all_gather", "backward")
    resharded = strategy != "shard_grad_op"
    expected_backward = units if resharded else 0
    if backward != expected_backward:
        if resharded and backward == units - 1:
            why = ("the root was not resharded after forward: the default reshard_after_forward=None keeps the root "
                   "unsharded; pass reshard_after_forward=True to every unit, root included")
        elif resharded:
            why = "full sharding frees the parameters after forward: reshard_after_forward=True"
        else:
            why = "shard_grad_op keeps the gathered parameters until backward ends: reshard_after_forward=False"
        raise AssertionError(f"{where}: {backward} all-gathers in backward, expected {expected_backward} "
                             f"({units} units, {forward} all-gathers in forward): {why}")
    assert forward == units and _count(records, "reduce_scatter") == units, (
        f"{where}: expected {units} all-gathers in forward and {units} reduce-scatters, got {forward} and "
        f"{_count(records, 'reduce_scatter')}")
    # Rank 0 holds the first ceil(rows / shards) rows of a resharded parameter (the root's embed.weight has WIDTH
    # rows, a Layer's fc1.weight 2 * WIDTH), all of it when the parameters stay gathered.
    expected_held = {"root": math.ceil(WIDTH / shards) / WIDTH if resharded else 1.0,
                     "layer": math.ceil(2 * WIDTH / shards) / (2 * WIDTH) if resharded else 1.0}
    got_held = report["after_forward"]
    assert all(abs(got_held[k] - v) < 1e-9 for k, v in expected_held.items()), (
        f"{where}: right after forward rank 0 held these fractions of the root's and a Layer's parameters: "
        f"{got_held}; expected {expected_held} ({'resharded' if resharded else 'kept whole'} after forward)")
    psi, psi_padded = num_params(model), padded_num_params(model, shards)
    group = shards if strategy == "hybrid_shard" else None
    predicted = theory.comm_breakdown(strategy, psi_padded, world_size, group_size=group, bytes_per_element=4,
                                      kind="payload")
    unpadded = theory.comm_breakdown(strategy, psi, world_size, group_size=group, bytes_per_element=4, kind="payload")
    for op in OPS:
        got = _payload(records, op)
        assert got == predicted[op], (
            f"{where}: {op} payload {got} bytes; helpers.theory predicts {predicted[op]:.0f} on the padded parameter "
            f"count ({psi_padded}; unpadded {psi}: {unpadded[op]:.0f} bytes)")


_APPLY_STRATEGIES = ("no_shard", "shard_grad_op", "full_shard", "hybrid_shard")
_apply_cache = {}  # {definitions(ns): rank 0's report}: both 9.2 checks share one launch


def _apply_report(ns):
    """Rank 0's report of every strategy on 4 ranks (one launch per version of the student's definitions)."""
    apply_strategy, key = answer(ns, "apply_strategy"), definitions(ns)
    if key not in _apply_cache:
        _apply_cache.clear()
        try:
            _apply_cache[key] = run_on_ranks(
                _on_ranks_apply, 4, (apply_strategy, _APPLY_STRATEGIES),
                "apply_strategy (fully_shard the blocks first, deepest first, and the root last)")[0]
        except Exception as exc:  # noqa: BLE001 - the second check reports the same failure without a new launch
            _apply_cache[key] = exc
    report = _apply_cache[key]
    if isinstance(report, Exception):
        raise report
    for strategy, r in report.items():
        assert "error" not in r, f"{strategy}: {r['error']}"
    return report


@public_check("9.2")
def ddp_zero2_and_fsdp_on_a_1d_mesh(ns):
    report = _apply_report(ns)
    ddp = report["no_shard"]
    psi = num_params(make_net())
    assert ddp["ddp"] and not ddp["units"], (
        f"no_shard: expected torch DDP (DistributedDataParallel over mesh.get_group()), got "
        f"{'FSDP units ' + str(ddp['units']) if ddp['units'] else 'a model that is not DDP'}")
    assert _payload(ddp["records"], "all_reduce") == 4 * psi and not _count(ddp["records"], "all_gather"), (
        f"no_shard: expected all-reduces of 4 * {psi} bytes in total and no all-gather, got {ddp['records']}")
    for strategy in ("shard_grad_op", "full_shard"):
        assert not report[strategy]["ddp"], f"{strategy}: fully_shard the model, do not wrap it in DDP"
        _check_sharded(strategy, report[strategy], 4, 4)


@public_check("9.2")
def hsdp_on_a_2d_mesh(ns):
    report = _apply_report(ns)["hybrid_shard"]
    assert report["placements"] == "(Replicate(), Shard(dim=0))", (
        f"hybrid_shard on a 2 x 2 mesh: a Layer weight has placements {report['placements']}; expected "
        "(Replicate(), Shard(dim=0)): pass the 2-D mesh itself to fully_shard")
    groups = sorted({r[3] for r in report["records"] if r[0] == "all_gather"})
    assert groups == [2], ("hybrid_shard on 2 x 2: all-gathers should run over the shard groups of 2, "
                           f"got sizes {groups}")
    _check_sharded("hybrid_shard", report, 4, 2)
