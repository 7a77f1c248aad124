"""Checks of lab 10.2: the GPT trained with the student's lab 07 ZeRO-2, against torch ZeroRedundancyOptimizer."""
from helpers.grading.checks.lab10.common import (
    WORLD_SIZE,
    equal_to_torch,
    identical_parameters_from_different_data,
    per_step,
    runs,
)
from helpers.grading.registry import public_check

WHAT = "end bring_zero2 with `return reduce_scatter_gradients, zero_adamw_step`, the two functions themselves"
HINT = "Every rank must issue the same collectives in every step: one reduce-scatter, then one all-gather. "


def _pair(component):
    return isinstance(component, tuple) and len(component) == 2 and all(callable(f) for f in component)


def _runs(ns):
    return runs(ns, "10.2", "zero2", "bring_zero2", _pair, WHAT, hint=HINT)


def _shard(mine):
    return -(-mine[0]["params"].numel() // WORLD_SIZE)   # ceil(psi / N)


@public_check("10.2")
def different_data_identical_parameters(ns):
    mine, _ = _runs(ns)
    identical_parameters_from_different_data(mine, "every rank must step its shard with the MEAN gradient's shard "
                                                   "and all-gather every rank's updated shard")


@public_check("10.2")
def one_reduce_scatter_one_all_gather(ns):
    """No hidden all-reduce: ZeRO-2 sends DDP's bytes as a reduce-scatter of the gradient + an all-gather."""
    mine, _ = _runs(ns)
    padded = 4 * WORLD_SIZE * _shard(mine)
    for rank, step, ops in per_step(mine):
        where = f"rank {rank}, step {step}"
        assert "all_reduce" not in ops, (
            f"{where}: your step issued {ops['all_reduce']['calls']} all-reduce(s); ZeRO-2 reduce-scatters the flat "
            "gradient (dist.reduce_scatter_single) so that each rank receives only its shard: half the bytes")
        calls = {op: t["calls"] for op, t in ops.items()}
        assert calls == {"reduce_scatter": 1, "all_gather": 1}, (
            f"{where}: your step issued {calls}; ZeRO-2 is one reduce_scatter_single of the padded flat gradient and "
            "one all_gather_single of the updated shards")
        for op in calls:
            assert ops[op]["payload_bytes"] == padded, (
                f"{where}: the {op} moved {ops[op]['payload_bytes']} bytes; the padded flat parameter is "
                f"{padded} bytes (N x ceil(psi / N) float32 elements)")


@public_check("10.2")
def holds_its_shard_of_gradients_and_moments(ns):
    """Between steps: the whole model, the gradient's shard, AdamW's moments for the shard only."""
    mine, _ = _runs(ns)
    psi, shard = mine[0]["params"].numel(), _shard(mine)
    for rank, out in enumerate(mine):
        held = out["state"]
        assert held["grads"] == 4 * shard, (
            f"rank {rank} holds {held['grads']} bytes of gradients between steps; ZeRO-2 keeps only its shard, "
            f"4 x {shard} = {4 * shard}: set every p.grad = None in reduce_scatter_gradients")
        assert held["optimizer"] == 8 * shard, (
            f"rank {rank} holds {held['optimizer']} bytes of AdamW moments; its shard's are 2 x 4 x {shard} = "
            f"{8 * shard}: update the state dict you are given, in place")
        assert held["params"] == 4 * psi, f"rank {rank} holds {held['params']} bytes of parameters, not 4 x {psi}"


@public_check("10.2")
def equals_zero_redundancy_optimizer(ns):
    mine, theirs = _runs(ns)
    equal_to_torch(mine, theirs, "torch ZeroRedundancyOptimizer",
                   grads_hint="reduce-scatter the padded flat gradient in parameter order, and divide its sum by "
                              "the world size",
                   params_hint="AdamW with DECOUPLED weight decay (p *= 1 - lr * weight_decay), bias-corrected "
                               "moments kept in state from step to step")
