"""Communication formulas: collectives per training step for each strategy, and alpha-beta costs.

Sizes follow one convention everywhere: the *payload* S of a collective is the full (unsharded)
tensor: the all_reduce tensor, the all_gather output, the reduce_scatter input. Ring algorithms then
send (and receive) per rank: all_reduce 2 (N-1)/N S, all_gather and reduce_scatter (N-1)/N S each.
The ZeRO paper's "logical" volume counts an all_reduce of S as 2 S (a reduce-scatter plus an
all-gather), so DDP moves 2 Psi and ZeRO-3 moves 3 Psi = 1.5x DDP, not 3x.
`helpers.theory` re-exports everything public here.
"""
from numbers import Integral, Real
from typing import NamedTuple

import numpy as np

COLLECTIVES = ("all_gather", "reduce_scatter", "all_reduce")

# Strategy name -> ZeRO stage: what it shards (1 optimizer state, 2 + gradients, 3 + parameters).
# HYBRID_SHARD is FULL_SHARD inside a group of `group_size` ranks and DDP across the groups.
STRATEGY_STAGE = {
    "ddp": 0, "zero1": 1, "zero2": 2, "zero3": 3,
    "no_shard": 0, "shard_grad_op": 2, "full_shard": 3, "hybrid_shard": 3,
}


# --- input validation: every error says what to pass instead ------------------------------------

def _check_number(name, value, example, *, allow_zero=False):
    """Raise ValueError unless value is a real number > 0 (>= 0 with allow_zero)."""
    if isinstance(value, bool) or not isinstance(value, Real):
        raise ValueError(f"{name} must be a number, e.g. {example}; got {value!r}")
    if value < 0 or (value == 0 and not allow_zero):
        bound = ">= 0" if allow_zero else "> 0"
        raise ValueError(f"{name} must be {bound}, e.g. {example}; got {value!r}")


def _check_count(name, value, example):
    """Raise ValueError unless value is an integer >= 1 (a number of ranks or devices)."""
    if isinstance(value, bool) or not isinstance(value, Integral) or value < 1:
        raise ValueError(f"{name} must be an integer >= 1 (a number of ranks), e.g. {example}; "
                         f"got {value!r}")


def normalize_strategy(strategy):
    """Canonical strategy name ('ddp', 'zero1'..'zero3', 'full_shard', ...) from a name or a ShardingStrategy."""
    name = getattr(strategy, "name", strategy)  # accepts torch's ShardingStrategy enum members
    if isinstance(name, str):
        key = name.strip().lower().replace("-", "").replace(" ", "")
        if key in STRATEGY_STAGE:
            return key
    raise ValueError(f"unknown strategy {strategy!r}; pass one of {sorted(STRATEGY_STAGE)} "
                     f"(case-insensitive, 'ZeRO-3' works too)")


def shard_degree(strategy, world_size, group_size=None):
    """Number of ranks a strategy's sharded state is split across: world_size, or group_size for hybrid_shard."""
    strategy = normalize_strategy(strategy)
    _check_count("world_size", world_size, 8)
    if strategy != "hybrid_shard":
        if group_size is not None:
            raise ValueError(f"group_size applies only to 'hybrid_shard', not {strategy!r}; "
                             "drop it or pass strategy='hybrid_shard'")
        return world_size
    if group_size is None:
        raise ValueError("hybrid_shard needs group_size= (ranks per shard group, e.g. GPUs per host)")
    _check_count("group_size", group_size, 8)
    if world_size % group_size:
        raise ValueError(f"group_size={group_size} must divide world_size={world_size}; "
                         "pass a divisor of world_size (each replica is one whole shard group)")
    return group_size


# --- collectives per step -------------------------------------------------------------------------

class Collective(NamedTuple):
    """One collective per step: op, payload numel S (full tensor), participating ranks, phase."""
    op: str
    numel: float
    group_size: int
    phase: str


def collectives_per_step(strategy, num_params, world_size, *, group_size=None):
    """The collectives one rank joins per training step (payload in elements), in issue order."""
    strategy = normalize_strategy(strategy)
    _check_number("num_params", num_params, "7.5e9")
    n, psi = world_size, num_params
    g = shard_degree(strategy, world_size, group_size)
    if strategy in ("ddp", "no_shard"):
        return [Collective("all_reduce", psi, n, "backward")]
    if strategy in ("zero1", "zero2"):
        # Each rank updates its shard, so it needs only its shard of the summed gradient,
        # then everyone gathers the updated parameters: 2 Psi, the same as DDP's all_reduce.
        return [Collective("reduce_scatter", psi, n, "backward"),
                Collective("all_gather", psi, n, "step")]
    if strategy == "shard_grad_op":
        # Parameters are gathered once, before forward, and kept through backward.
        return [Collective("all_gather", psi, n, "forward"),
                Collective("reduce_scatter", psi, n, "backward")]
    # zero3 / full_shard / hybrid_shard free parameters after forward, so backward gathers them again.
    # (Real FSDP keeps the root module unsharded after forward, so a ledger shows slightly less.)
    calls = [Collective("all_gather", psi, g, "forward"),
             Collective("all_gather", psi, g, "backward"),
             Collective("reduce_scatter", psi, g, "backward")]
    if strategy == "hybrid_shard":
        # Each rank's gradient shard (Psi / g) is averaged with the same shard on the other replicas.
        calls.append(Collective("all_reduce", psi / g, n // g, "backward"))
    return calls


def ring_wire_bytes(op, size_bytes, world_size):
    """Bytes each rank sends (and receives) in a ring collective of payload size_bytes."""
    _check_number("size_bytes", size_bytes, "4e6", allow_zero=True)
    return _bandwidth_factor(op, world_size) * size_bytes


def _logical_factor(op):
    """ZeRO-paper accounting: an all_reduce counts as reduce-scatter + all-gather."""
    return 2 if op == "all_reduce" else 1


def comm_breakdown(strategy, num_params, world_size, *, group_size=None, bytes_per_element=1,
                   kind="wire"):
    """Per-rank volume per step by collective ({'all_gather', 'reduce_scatter', 'all_reduce'}).

    Units are bytes, or elements with the default bytes_per_element=1. kind is 'payload' (sum of S),
    'logical' (ZeRO paper: all_reduce counts 2 S) or 'wire' (ring bytes sent per rank)."""
    if kind not in ("payload", "logical", "wire"):
        raise ValueError(f"kind must be 'payload', 'logical' or 'wire'; got {kind!r}")
    _check_number("bytes_per_element", bytes_per_element, "2 for fp16, 4 for fp32")
    totals = dict.fromkeys(COLLECTIVES, 0.0)
    for call in collectives_per_step(strategy, num_params, world_size, group_size=group_size):
        size = call.numel * bytes_per_element
        if kind == "logical":
            size *= _logical_factor(call.op)
        elif kind == "wire":
            size = ring_wire_bytes(call.op, size, call.group_size)
        totals[call.op] += size
    return totals


def comm_volume(strategy, num_params, world_size, *, group_size=None, bytes_per_element=1,
                kind="logical"):
    """Total per-rank volume per step: logical by default (DDP 2 Psi, ZeRO-3 3 Psi); units as comm_breakdown."""
    return sum(comm_breakdown(strategy, num_params, world_size, group_size=group_size,
                              bytes_per_element=bytes_per_element, kind=kind).values())


def fsdp_paper_cross_host_elements(strategy, num_params, world_size, gpus_per_host):
    """Cross-host elements per GPU per step as the FSDP paper (Zhao et al. 2023, 3.2.2) states them.

    DDP 2M(W-1)/W, full sharding 3M(W-1)/W, hybrid 2M(W-1)/(GW). The paper's hybrid figure is an
    upper bound: an exact ring all_reduce of M/G over W/G replicas moves 2M(W-G)/(GW), which is what
    comm_breakdown('hybrid_shard', ...)['all_reduce'] returns; both are about 2M/G when W >> G."""
    strategy = normalize_strategy(strategy)
    _check_number("num_params", num_params, "7.5e9")
    _check_count("world_size", world_size, 16)
    _check_count("gpus_per_host", gpus_per_host, 8)
    m, w, g = num_params, world_size, gpus_per_host
    formulas = {"ddp": 2 * m * (w - 1) / w, "no_shard": 2 * m * (w - 1) / w,
                "zero3": 3 * m * (w - 1) / w, "full_shard": 3 * m * (w - 1) / w,
                "hybrid_shard": 2 * m * (w - 1) / (g * w)}
    if strategy not in formulas:
        raise ValueError(f"the FSDP paper gives cross-host traffic only for {sorted(formulas)}; "
                         f"got {strategy!r}")
    return formulas[strategy]


# --- alpha-beta cost model ------------------------------------------------------------------------
# T = steps(N) * alpha + factor(N) * S * beta: alpha is the per-message latency (s), beta the
# inverse bandwidth (s/byte), S the payload (bytes). Ring algorithms chunk S into N pieces.

_COST_MODELS = {
    "all_reduce": (lambda n: 2 * (n - 1), lambda n: 2 * (n - 1) / n),
    "all_gather": (lambda n: n - 1, lambda n: (n - 1) / n),
    "reduce_scatter": (lambda n: n - 1, lambda n: (n - 1) / n),
    # The whole tensor passed round the ring unchunked: (N-1) S per rank, a common tutorial bug.
    "unchunked_ring_all_reduce": (lambda n: n - 1, lambda n: n - 1),
    # Reduce to a root, then broadcast from it; the root's link carries all 2 (N-1) messages in turn.
    "naive_all_reduce": (lambda n: 2 * (n - 1), lambda n: 2 * (n - 1)),
    "send": (lambda n: 1, lambda n: 1),  # one point-to-point message
}
RING_OPS = ("all_reduce", "all_gather", "reduce_scatter", "unchunked_ring_all_reduce")


def _cost_model(op):
    """(latency steps, bandwidth factor) functions of N for op."""
    if op not in _COST_MODELS:
        raise ValueError(f"unknown op {op!r}; pass one of {sorted(_COST_MODELS)}")
    return _COST_MODELS[op]


def _bandwidth_factor(op, world_size):
    """Bytes each rank sends per payload byte in ring op over world_size ranks."""
    if op not in RING_OPS:
        raise ValueError(f"ring wire bytes are defined for {list(RING_OPS)}; got {op!r}")
    _check_count("world_size", world_size, 4)
    return _COST_MODELS[op][1](world_size)


def collective_time(op, size_bytes, world_size, alpha_s, beta_s_per_byte):
    """Alpha-beta time in seconds of op (see _COST_MODELS) on a size_bytes payload."""
    steps, factor = _cost_model(op)
    _check_number("size_bytes", size_bytes, "4e6", allow_zero=True)
    _check_count("world_size", world_size, 4)
    _check_number("alpha_s", alpha_s, "1e-5", allow_zero=True)
    _check_number("beta_s_per_byte", beta_s_per_byte, "1e-10 (10 GB/s)", allow_zero=True)
    n = world_size
    return steps(n) * alpha_s + factor(n) * size_bytes * beta_s_per_byte


def ring_all_reduce_time(size_bytes, world_size, alpha_s, beta_s_per_byte):
    """Ring all-reduce seconds: 2(N-1) alpha + 2(N-1)/N S beta."""
    return collective_time("all_reduce", size_bytes, world_size, alpha_s, beta_s_per_byte)


def ring_all_gather_time(size_bytes, world_size, alpha_s, beta_s_per_byte):
    """Ring all-gather seconds (S = gathered output bytes): (N-1) alpha + (N-1)/N S beta."""
    return collective_time("all_gather", size_bytes, world_size, alpha_s, beta_s_per_byte)


def ring_reduce_scatter_time(size_bytes, world_size, alpha_s, beta_s_per_byte):
    """Ring reduce-scatter seconds (S = input bytes): (N-1) alpha + (N-1)/N S beta."""
    return collective_time("reduce_scatter", size_bytes, world_size, alpha_s, beta_s_per_byte)


def naive_all_reduce_time(size_bytes, world_size, alpha_s, beta_s_per_byte):
    """Reduce-to-root then broadcast, seconds: 2(N-1) (alpha + S beta), serialised at the root."""
    return collective_time("naive_all_reduce", size_bytes, world_size, alpha_s, beta_s_per_byte)


def unchunked_ring_all_reduce_time(size_bytes, world_size, alpha_s, beta_s_per_byte):
    """Whole tensor passed round the ring, seconds: (N-1) (alpha + S beta)."""
    return collective_time("unchunked_ring_all_reduce", size_bytes, world_size, alpha_s,
                           beta_s_per_byte)


def fit_alpha_beta(sizes_bytes, times_s, world_size=2, op="send"):
    """Least-squares (alpha_s, beta_s_per_byte) from measured (size in bytes, time in s) pairs of op."""
    # Residuals are relative (each row divided by its time): sizes span decades, and plain least
    # squares would let the large, slow sizes drown the latency term.
    steps, factor = _cost_model(op)
    _check_count("world_size", world_size, 2)
    sizes = np.asarray(sizes_bytes, dtype=float)
    times = np.asarray(times_s, dtype=float)
    if sizes.ndim != 1 or sizes.shape != times.shape:
        raise ValueError(f"sizes_bytes and times_s must be 1-D and the same length; got shapes "
                         f"{sizes.shape} and {times.shape}")
    if len(np.unique(sizes)) < 2:
        raise ValueError("fit_alpha_beta needs at least two different sizes to separate "
                         "latency from bandwidth; measure e.g. 1 KB and 1 MB payloads")
    n = world_size
    if steps(n) == 0 or factor(n) == 0:
        raise ValueError(f"{op} on world_size={n} moves no data, so nothing can be fitted; "
                         "pass the world_size the times were measured at (>= 2)")
    if np.any(times <= 0):
        raise ValueError("times_s must all be > 0 seconds (a measured duration per call)")
    design = np.column_stack([np.full_like(sizes, steps(n)), factor(n) * sizes])
    (alpha, beta), *_ = np.linalg.lstsq(design / times[:, None], np.ones_like(times), rcond=None)
    return float(alpha), float(beta)
