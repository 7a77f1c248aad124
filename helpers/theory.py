"""The course's formulas: ZeRO memory per device, communication per strategy, alpha-beta costs.

Pure functions, no torch. Memory is in bytes per device; "GB" is 1e9 bytes as in the ZeRO paper
(Rajbhandari et al. 2020, arXiv 1910.02054). The default byte convention is the paper's mixed-precision
Adam: 2 bytes fp16 parameters + 2 bytes fp16 gradients + K = 12 bytes optimizer state (fp32 master
parameters, momentum, variance) = 16 bytes per parameter. Other conventions are explicit keywords or
named presets in CONVENTIONS, never silent. Communication formulas live in helpers/theory_comm.py and
are re-exported here, so `from helpers.theory import comm_volume` works.
"""
from numbers import Integral

from helpers.theory_comm import (
    COLLECTIVES,
    RING_OPS,
    STRATEGY_STAGE,
    Collective,
    _check_count,
    _check_number,
    collective_time,
    collectives_per_step,
    comm_breakdown,
    comm_volume,
    fit_alpha_beta,
    fsdp_paper_cross_host_elements,
    naive_all_reduce_time,
    normalize_strategy,
    ring_all_gather_time,
    ring_all_reduce_time,
    ring_reduce_scatter_time,
    ring_wire_bytes,
    shard_degree,
    unchunked_ring_all_reduce_time,
)

GB = 1e9  # bytes; the ZeRO paper's unit
GiB = 2**30  # bytes; what nvidia-smi and torch.cuda report as "GB"

# Bytes per parameter, as keyword sets: zero_memory(psi, dp, stage, **CONVENTIONS["fp32_grads"]).
CONVENTIONS = {
    # ZeRO paper 3.1: fp16 params + fp16 grads + fp32 master params, momentum and variance: 16.
    "zero_paper_mixed_adam": {"param_bytes": 2, "grad_bytes": 2, "k": 12},
    # Gradients kept in fp32 (e.g. bf16 params with fp32 grads): 18.
    "fp32_grads": {"param_bytes": 2, "grad_bytes": 4, "k": 12},
    # fp16 gradients plus an fp32 accumulation buffer, counted (and sharded) as gradients: 20.
    "fp32_grad_accum": {"param_bytes": 2, "grad_bytes": 6, "k": 12},
    # Plain fp32 training: no master copy needed, Adam keeps momentum and variance: 16.
    "fp32_adam": {"param_bytes": 4, "grad_bytes": 4, "k": 8},
}

# fp32 optimizer state per parameter, excluding any fp32 master copy of the parameters.
OPTIMIZER_STATE_BYTES = {"adam": 8, "adamw": 8, "sgd_momentum": 4, "sgd": 0}
MASTER_WEIGHT_BYTES = 4  # the fp32 copy that mixed precision updates


def optimizer_k(optimizer="adam", *, master_weights=True):
    """Optimizer-state bytes per parameter K: fp32 states, plus 4 for an fp32 master copy if kept."""
    if optimizer not in OPTIMIZER_STATE_BYTES:
        raise ValueError(f"unknown optimizer {optimizer!r}; pass one of "
                         f"{sorted(OPTIMIZER_STATE_BYTES)} or give k= (bytes per parameter) directly")
    return OPTIMIZER_STATE_BYTES[optimizer] + (MASTER_WEIGHT_BYTES if master_weights else 0)


def _check_stage(stage):
    """Raise ValueError unless stage is 0, 1, 2 or 3."""
    if isinstance(stage, bool) or not isinstance(stage, Integral) or stage not in (0, 1, 2, 3):
        raise ValueError(f"stage must be 0 (DDP), 1 (ZeRO-1: shard optimizer state), 2 (ZeRO-2: "
                         f"+ gradients) or 3 (ZeRO-3: + parameters); got {stage!r}. For names like "
                         "'full_shard' use strategy_memory(..., strategy=...)")


def bytes_per_param(dp, stage, k=12, *, param_bytes=2, grad_bytes=2):
    """Bytes per device per model parameter by category ('params', 'grads', 'optimizer', 'total')."""
    _check_count("dp", dp, 64)
    _check_stage(stage)
    for name, value in (("k", k), ("param_bytes", param_bytes), ("grad_bytes", grad_bytes)):
        _check_number(name, value, "12 for mixed-precision Adam, 2 for fp16, 4 for fp32",
                      allow_zero=True)
    # Stage s shards the first s of (optimizer state, gradients, parameters) over dp devices.
    per_param = {
        "params": param_bytes / dp if stage >= 3 else param_bytes,
        "grads": grad_bytes / dp if stage >= 2 else grad_bytes,
        "optimizer": k / dp if stage >= 1 else k,
    }
    per_param["total"] = sum(per_param.values())
    return per_param


def zero_memory(num_params, dp, stage, k=12, *, param_bytes=2, grad_bytes=2):
    """Model-state bytes per device ('params', 'grads', 'optimizer', 'total') for ZeRO stage 0-3."""
    _check_number("num_params", num_params, "7.5e9 for 7.5B parameters")
    per_param = bytes_per_param(dp, stage, k, param_bytes=param_bytes, grad_bytes=grad_bytes)
    return {name: num_params * b for name, b in per_param.items()}


def strategy_memory(num_params, world_size, strategy, k=12, *, param_bytes=2, grad_bytes=2,
                    group_size=None):
    """Model-state bytes per device for a named strategy ('ddp', 'zero2', 'full_shard', 'hybrid_shard', ...)."""
    stage = STRATEGY_STAGE[normalize_strategy(strategy)]
    dp = shard_degree(strategy, world_size, group_size)
    return zero_memory(num_params, dp, stage, k, param_bytes=param_bytes, grad_bytes=grad_bytes)


def max_num_params(memory_bytes, dp, stage, k=12, *, param_bytes=2, grad_bytes=2):
    """Largest parameter count whose model states fit memory_bytes per device (exact, not rounded)."""
    _check_number("memory_bytes", memory_bytes, "32 * GB")
    per_param = bytes_per_param(dp, stage, k, param_bytes=param_bytes, grad_bytes=grad_bytes)
    if per_param["total"] == 0:
        raise ValueError("all byte counts are 0, so any model fits; pass k, param_bytes or "
                         "grad_bytes > 0")
    return memory_bytes / per_param["total"]


__all__ = [
    "GB", "GiB", "CONVENTIONS", "OPTIMIZER_STATE_BYTES", "MASTER_WEIGHT_BYTES",
    "optimizer_k", "bytes_per_param", "zero_memory", "strategy_memory", "max_num_params",
    # re-exported from helpers.theory_comm
    "COLLECTIVES", "RING_OPS", "STRATEGY_STAGE", "Collective", "normalize_strategy", "shard_degree",
    "collectives_per_step", "comm_breakdown", "comm_volume", "fsdp_paper_cross_host_elements",
    "ring_wire_bytes", "collective_time", "ring_all_reduce_time", "ring_all_gather_time",
    "ring_reduce_scatter_time", "naive_all_reduce_time", "unchunked_ring_all_reduce_time",
    "fit_alpha_beta",
]
