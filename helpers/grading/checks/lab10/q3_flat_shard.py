"""Checks of lab 10.3: the GPT trained with the student's lab 08 FlatShard units, against FSDP2 fully_shard."""
from helpers.grading.checks.lab10.common import (
    WORLD_SIZE,
    equal_to_torch,
    identical_parameters_from_different_data,
    per_step,
    runs,
)
from helpers.grading.registry import public_check

WHAT = "return the class itself: end bring_flat_shard with `return FlatShard`"
HINT = ("Every rank must gather and reduce-scatter the same units in the same order: unshard() before forward and "
        "backward, reduce_scatter_grads() once flat.grad is complete. ")
BLOCKS = 2   # 3 units: 2 blocks and the root


def _runs(ns):
    return runs(ns, "10.3", "flatshard", "bring_flat_shard", lambda c: isinstance(c, type), WHAT, hint=HINT,
                n_layer=BLOCKS)


def _padded_bytes(mine):
    """4 x the padded numel of every unit: what one all-gather (or reduce-scatter) of every unit moves."""
    return 4 * WORLD_SIZE * sum(shard for _, shard in mine[0]["layout"]["units"])


@public_check("10.3")
def different_data_identical_parameters(ns):
    mine, _ = _runs(ns)
    identical_parameters_from_different_data(mine, "gathered from the shards, every rank's units must hold the "
                                                   "same values: reduce-scatter the MEAN gradient into flat_shard")


@public_check("10.3")
def two_all_gathers_and_one_reduce_scatter_per_unit(ns):
    mine, _ = _runs(ns)
    units, padded = len(mine[0]["layout"]["units"]), _padded_bytes(mine)
    assert units == BLOCKS + 1, f"{units} units; expected one per block ({BLOCKS}) and the root"
    for rank, step, ops in per_step(mine):
        where = f"rank {rank}, step {step}"
        assert "all_reduce" not in ops, (f"{where}: your units issued an all-reduce; FSDP reduce-scatters each "
                                         "unit's gradient (dist.reduce_scatter_single): each rank keeps its shard")
        calls = {op: t["calls"] for op, t in ops.items()}
        assert calls == {"all_gather": 2 * units, "reduce_scatter": units}, (
            f"{where}: your {units} units issued {calls}; per unit and step: an all-gather before its forward, "
            "another before its backward, one reduce-scatter of its gradient")
        assert ops["all_gather"]["payload_bytes"] == 2 * padded and ops["reduce_scatter"]["payload_bytes"] == padded, (
            f"{where}: all-gathers {ops['all_gather']['payload_bytes']} and reduce-scatter "
            f"{ops['reduce_scatter']['payload_bytes']} bytes; every unit's padded flat buffer is {padded} bytes in "
            "all, gathered twice and reduce-scattered once")


@public_check("10.3")
def equals_fully_shard(ns):
    mine, theirs = _runs(ns)
    equal_to_torch(mine, theirs, "FSDP2 fully_shard",
                   grads_hint="reduce-scatter each unit's padded flat.grad and divide by the world size",
                   params_hint="the optimizer must step the shards (model.parameters() after sharding)")


@public_check("10.3")
def holds_only_shards_between_steps(ns):
    mine, _ = _runs(ns)
    holds_only_shards(mine)


FREE = "reshard() must resize flat's storage to 0 bytes (flat.untyped_storage().resize_(0))"


def holds_only_shards(mine, free=FREE):
    """Between steps every rank holds its shards only (10.3 and 10.5): 0 bytes in any unit's full flat buffer."""
    shards = 4 * sum(shard for _, shard in mine[0]["layout"]["units"])
    for rank, out in enumerate(mine):
        held = out["state"]
        assert held["unsharded"] == 0, (
            f"rank {rank} still holds {held['unsharded']} bytes in the units' full flat buffers between steps; "
            f"{free}")
        assert held["params"] == shards and held["grads"] == shards, (
            f"rank {rank} holds {held['params']} bytes of parameters and {held['grads']} of gradients; its shards "
            f"are {shards} bytes each: flat_shard must be a clone of this rank's slice, its .grad the shard's")
