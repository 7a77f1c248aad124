"""An alpha-beta simulator of one data-parallel (DDP) training step, to extrapolate past one machine.

Pure functions, no torch; seconds end in _s, bytes in _bytes, bandwidths in _bytes_per_s. The model, whose every
simplification chapter 05 states next to its figures:
- one step = compute_s (forward + backward + optimizer on one GPU's batch) + the gradient all-reduce;
- the num_params * bytes_per_param gradient bytes are all-reduced in buckets of bucket_cap_bytes (the
  last one smaller), one all-reduce each, each paying the full latency. Gradients are treated as
  divisible bytes: DDP keeps whole parameters in a bucket and caps its first bucket at 1 MiB (lab 05);
- overlap: communication runs under a fraction `overlap` of compute_s and adds only what sticks out,
  step = compute_s + max(0, comm_s - overlap * compute_s). DDP overlaps with backward, which is about
  2/3 of forward + backward (backward costs about twice the forward: about 2N FLOPs per token forward,
  6N for training, Kaplan et al. 2020, arXiv 2001.08361, section 2.1; chapter 05 measures its own ratio):
  overlap=2/3. 0 = no overlap.

Networks. A Link is one kind of link between every pair of ranks (the alpha-beta model of chapter 02, costs from
helpers.theory). A Network is a cluster as NCCL sees it: nodes of gpus_per_node GPUs on NVLink, each node with
nics_per_node NICs. NCCL runs several rings (channels) at once, spread over the NICs, so a ring that crosses nodes
moves its bytes at min(NVLink per GPU, all the node's NICs together), not at one NIC's bandwidth. Each algorithm
costs latency + size_bytes * seconds_per_byte, the shape of NCCL's own tuning model
(NVIDIA/nccl:src/graph/tuning.cc@5067397c2676, ncclTopoTuneModel and ncclTopoGetAlgoTime):

| algorithm    | latency (hops)                                 | bytes per GPU, per direction             |
| ------------ | ---------------------------------------------- | ---------------------------------------- |
| ring         | 2(N - nodes) intra + 2(nodes - 1) inter        | 2(N-1)/N S at min(NVLink, node's NICs)   |
| tree         | 2(g - 1) intra + 2 floor(log2 nodes) inter     | 2S on NVLink; per node 2S on the NICs    |
|              |                                                | (S on 2 nodes), at TREE_EFFICIENCY       |
| hierarchical | 2(g - 1) intra + 2(nodes - 1) inter, 3 calls   | in-node reduce-scatter + all-gather, and |
|              |                                                | the node's NICs shared by g all-reduces  |
| nccl         | the faster of ring and tree for this size, as NCCL's tuner picks                          |

plus base_s once per call. N = world_size, g = GPUs per node, S = size_bytes. Not modelled: NCCL's protocols
(LL, LL128 for small sizes: lower latency), NVLink SHARP, congestion, stragglers, compute that slows down when the
per-GPU batch shrinks.
"""
import math
from numbers import Integral, Real
from typing import NamedTuple

from helpers.theory import collective_time, collectives_per_step, normalize_strategy, ring_wire_bytes

MiB = 2**20
DDP_BUCKET_CAP_BYTES = 25 * MiB  # torch DDP's default bucket_cap_mb = 25 (MiB)
BACKWARD_SHARE = 2 / 3  # backward's share of forward + backward, the usual rule of thumb (an assumption)

# NCCL's tuning constants for its Simple protocol, the one it uses for large messages such as DDP's 25 MiB buckets
# (NVIDIA/nccl:src/graph/tuning.cc@5067397c2676, ncclTunerConstantsDefaults): base latency of a ring call 8.4 us,
# one ring step over NVLink 3.4 us (NCCL's tree: 4.0; one figure for both here), one step over the network 14 us;
# tree all-reduce bandwidth x 0.92.
NCCL_BASE_S = 8.4e-6
NCCL_NVLINK_HOP_S = 3.4e-6
NCCL_NET_HOP_S = 14e-6
TREE_EFFICIENCY = 0.92
ALGORITHMS = ("ring", "tree", "hierarchical", "nccl")


class Link(NamedTuple):
    """One kind of link: per-message latency alpha_s and bandwidth per direction."""

    name: str
    alpha_s: float
    bandwidth_bytes_per_s: float

    @property
    def beta_s_per_byte(self):
        """Seconds per byte: the inverse of the bandwidth."""
        return 1.0 / self.bandwidth_bytes_per_s


class Network(NamedTuple):
    """Nodes of gpus_per_node GPUs (NVLink per GPU, per direction) with nics_per_node NICs each; hop latencies."""

    name: str
    gpus_per_node: int
    nvlink_bytes_per_s: float
    nics_per_node: int
    nic_bytes_per_s: float
    intra_hop_s: float = NCCL_NVLINK_HOP_S
    inter_hop_s: float = NCCL_NET_HOP_S
    base_s: float = NCCL_BASE_S

    @property
    def node_nic_bytes_per_s(self):
        """All of a node's NICs together, per direction: what NCCL's rings share across nodes."""
        return self.nics_per_node * self.nic_bytes_per_s


class Cost(NamedTuple):
    """An algorithm's cost on one network and world size: time = latency_s + size_bytes * seconds_per_byte."""

    latency_s: float
    seconds_per_byte: float

    def time_s(self, size_bytes):
        """Seconds for a payload of size_bytes."""
        return self.latency_s + size_bytes * self.seconds_per_byte


# ASSUMPTIONS, round figures for illustration, not measurements: replace them with your cluster's
# (e.g. nccl-tests bus bandwidth and small-message latency). Bandwidths are per direction, per GPU.
ASSUMED_LINKS = {
    # NVLink 3 (A100): 12 links x 25 GB/s per direction = 300 GB/s per direction (600 GB/s both ways); NVIDIA,
    # "NVIDIA A100 Tensor Core GPU Architecture" (whitepaper, 2020), section "Third-Generation NVLink".
    "nvlink": Link("NVLink, 300 GB/s, 3 us (assumed)", 3e-6, 300e9),
    # InfiniBand HDR: 200 Gb/s = 25 GB/s per direction, one NIC per GPU, every hop on the network (e.g. one GPU
    # per node); nodes of 8 GPUs with 8 NICs are a Network, not this Link.
    "infiniband": Link("InfiniBand 200 Gb/s = 25 GB/s, 10 us (assumed)", 10e-6, 25e9),
    # A 25 Gb/s Ethernet NIC shared by a node's GPUs would be far worse; per GPU here for comparison.
    "ethernet": Link("Ethernet 25 Gb/s = 3.1 GB/s, 30 us (assumed)", 30e-6, 25e9 / 8),
}

# Line rates, latencies from NCCL's tuning constants (above). A DGX A100 has 8 A100s (NVLink 300 GB/s per
# direction each, the whitepaper above) and 8 HDR 200 Gb/s = 25 GB/s InfiniBand NICs per node.
ASSUMED_NETWORKS = {
    "dgx_a100": Network("8 A100 per node, NVLink 300 GB/s, 8 x 25 GB/s NICs (assumed)", 8, 300e9, 8, 25e9),
    "a100_one_nic": Network("8 A100 per node, NVLink 300 GB/s, 1 x 25 GB/s NIC (assumed)", 8, 300e9, 1, 25e9),
}


def link_from_fit(name, alpha_s, beta_s_per_byte):
    """A Link from a fitted (alpha_s, beta_s_per_byte), e.g. helpers.theory.fit_alpha_beta's result."""
    _check_positive("beta_s_per_byte", beta_s_per_byte)
    return Link(name, float(alpha_s), 1.0 / float(beta_s_per_byte))


def _check_positive(name, value, allow_zero=False):
    """Raise ValueError unless value is a real number > 0 (>= 0 with allow_zero)."""
    if isinstance(value, bool) or not isinstance(value, Real) or value < 0 or (value == 0 and not allow_zero):
        bound = ">= 0" if allow_zero else "> 0"
        raise ValueError(f"{name} must be a number {bound}; got {value!r}")


def _check_world_size(world_size):
    if isinstance(world_size, bool) or not isinstance(world_size, Integral) or world_size < 1:
        raise ValueError(f"world_size must be an integer >= 1 (a number of GPUs), e.g. 64; got {world_size!r}")


def bucket_sizes_bytes(total_bytes, bucket_cap_bytes=DDP_BUCKET_CAP_BYTES):
    """Sizes of the buckets that carry total_bytes: full buckets of bucket_cap_bytes, then the rest."""
    _check_positive("total_bytes", total_bytes, allow_zero=True)
    if bucket_cap_bytes is None:  # one bucket for everything
        return [total_bytes] if total_bytes else []
    _check_positive("bucket_cap_bytes", bucket_cap_bytes)
    full, rest = divmod(total_bytes, bucket_cap_bytes)
    return [bucket_cap_bytes] * int(full) + ([rest] if rest else [])


def _check_network(network):
    if not isinstance(network, (Link, Network)):
        raise ValueError(f"network must be a helpers.simulate.Link or Network, e.g. ASSUMED_NETWORKS['dgx_a100']; "
                         f"got {network!r}")
    if isinstance(network, Network):
        for name in ("gpus_per_node", "nics_per_node"):
            value = getattr(network, name)
            if isinstance(value, bool) or not isinstance(value, Integral) or value < 1:
                raise ValueError(f"Network.{name} must be an integer >= 1, e.g. 8; got {value!r}")
        for name in ("nvlink_bytes_per_s", "nic_bytes_per_s"):
            _check_positive(f"Network.{name}", getattr(network, name))
        for name in ("intra_hop_s", "inter_hop_s", "base_s"):
            _check_positive(f"Network.{name}", getattr(network, name), allow_zero=True)


def _layout(world_size, network):
    """(GPUs per node used, nodes) of world_size GPUs packed onto whole nodes."""
    per_node = min(world_size, network.gpus_per_node)
    return per_node, math.ceil(world_size / network.gpus_per_node)


def _ring_cost(world_size, network):
    n, (per_node, nodes) = world_size, _layout(world_size, network)
    # NCCL's channels spread the ring's node-to-node hops over all the node's NICs: the slowest of NVLink per GPU
    # and the node's NICs together paces it (nccl-tests doc/PERFORMANCE.md: busbw is that bottleneck).
    bottleneck = min([network.nvlink_bytes_per_s] * (per_node > 1) + [network.node_nic_bytes_per_s] * (nodes > 1))
    latency = network.base_s + 2 * (n - nodes) * network.intra_hop_s + 2 * (nodes - 1) * network.inter_hop_s
    return Cost(latency, 2 * (n - 1) / n / bottleneck)


def _tree_cost(world_size, network):
    per_node, nodes = _layout(world_size, network)
    # A chain inside each node, a double binary tree across nodes: each GPU sends 2S on NVLink (reduce up, broadcast
    # down); each node sends 2S through its NICs, or S on 2 nodes, where each node is the other's only neighbour.
    nic_bytes_per_byte = 0 if nodes == 1 else 1 if nodes == 2 else 2
    seconds_per_byte = max(2 / network.nvlink_bytes_per_s if per_node > 1 else 0,
                           nic_bytes_per_byte / network.node_nic_bytes_per_s)
    depth = math.floor(math.log2(nodes))  # NCCL's log2i
    latency = network.base_s + 2 * ((per_node - 1) * network.intra_hop_s + depth * network.inter_hop_s)
    return Cost(latency, seconds_per_byte / TREE_EFFICIENCY)


def _hierarchical_cost(world_size, network):
    g, nodes = _layout(world_size, network)
    if nodes == 1:
        return _ring_cost(world_size, network)
    if world_size % g:
        raise ValueError(f"hierarchical all-reduce needs whole nodes: world_size={world_size} is not a "
                         f"multiple of gpus_per_node={g}; pass a multiple of {g}, or algorithm='nccl'")
    # Three calls: reduce-scatter in the node, all-reduce of each GPU's S/g across nodes (the g all-reduces of a
    # node share its NICs: node_nic / g each), all-gather in the node.
    latency = 3 * network.base_s + 2 * (g - 1) * network.intra_hop_s + 2 * (nodes - 1) * network.inter_hop_s
    seconds_per_byte = (2 * (g - 1) / g / network.nvlink_bytes_per_s
                        + 2 * (nodes - 1) / nodes / network.node_nic_bytes_per_s)
    return Cost(latency, seconds_per_byte)


_COSTS = {"ring": _ring_cost, "tree": _tree_cost, "hierarchical": _hierarchical_cost}


def _check_algorithm(algorithm):
    if algorithm not in ALGORITHMS:
        raise ValueError(f"algorithm must be one of {ALGORITHMS} ('nccl': the faster of ring and tree); "
                         f"got {algorithm!r}")


def algorithm_cost(algorithm, world_size, network):
    """Cost(latency_s, seconds_per_byte) of an all-reduce by 'ring', 'tree' or 'hierarchical' on a Network."""
    _check_world_size(world_size)
    _check_network(network)
    if algorithm not in _COSTS:
        raise ValueError(f"algorithm_cost takes one of {sorted(_COSTS)}; 'nccl' depends on the size: "
                         f"use nccl_algorithm(size_bytes, world_size, network); got {algorithm!r}")
    if not isinstance(network, Network):
        raise ValueError("algorithm_cost needs a Network (nodes, NVLink, NICs); a Link is one flat ring: "
                         "use all_reduce_time_s")
    return _COSTS[algorithm](world_size, network)


def nccl_algorithm(size_bytes, world_size, network):
    """'ring' or 'tree': the faster all-reduce for this size, as NCCL's tuner picks (ncclTopoGetAlgoTime)."""
    ring, tree = (algorithm_cost(a, world_size, network).time_s(size_bytes) for a in ("ring", "tree"))
    return "ring" if ring <= tree else "tree"


def all_reduce_time_s(size_bytes, world_size, network, algorithm="nccl"):
    """Seconds of one all-reduce of size_bytes over world_size GPUs of `network` (a Link or a Network)."""
    _check_world_size(world_size)
    _check_network(network)
    _check_algorithm(algorithm)
    _check_positive("size_bytes", size_bytes, allow_zero=True)
    if world_size == 1:
        return 0.0
    if isinstance(network, Link):
        if algorithm not in ("ring", "nccl"):
            raise ValueError(f"a Link has no nodes, so only the flat ring applies; got algorithm={algorithm!r}. "
                             "Describe the cluster as a Network for 'tree' or 'hierarchical'")
        return collective_time("all_reduce", size_bytes, world_size, network.alpha_s, network.beta_s_per_byte)
    if algorithm == "nccl":
        algorithm = nccl_algorithm(size_bytes, world_size, network)
    return algorithm_cost(algorithm, world_size, network).time_s(size_bytes)


def algbw_bytes_per_s(size_bytes, time_s):
    """nccl-tests' algorithm bandwidth: payload bytes over time (NVIDIA/nccl-tests:doc/PERFORMANCE.md)."""
    _check_positive("time_s", time_s)
    return size_bytes / time_s


def busbw_bytes_per_s(op, size_bytes, time_s, world_size):
    """nccl-tests' bus bandwidth: algbw x 2(N-1)/N for all_reduce, x (N-1)/N for all_gather and reduce_scatter.

    That is the bytes each rank must send, helpers.theory.ring_wire_bytes, over the time: comparable with a link's
    peak bandwidth whatever N (NVIDIA/nccl-tests:doc/PERFORMANCE.md@a0b82b2260cf)."""
    _check_positive("time_s", time_s)
    return ring_wire_bytes(op, size_bytes, world_size) / time_s


def peak_busbw_bytes_per_s(world_size, network, algorithm):
    """All-reduce bus bandwidth of an algorithm as size_bytes grows without bound (latency negligible)."""
    cost = algorithm_cost(algorithm, world_size, network)
    return ring_wire_bytes("all_reduce", 1, world_size) / cost.seconds_per_byte


def strategy_comm_time_s(strategy, num_params, world_size, network, *, bytes_per_element=2):
    """Bandwidth-only seconds of one step's collectives for a strategy ('ddp', 'zero2', 'full_shard', 'hybrid_shard').

    Each collective of helpers.theory.collectives_per_step moves its ring bytes at NVLink inside a node and at
    min(NVLink, the node's NICs) across nodes (NCCL's rings); hybrid_shard shards inside each node and its
    cross-node all-reduces, one per GPU of a node at once, share the node's NICs. Latency is ignored."""
    _check_network(network)
    if not isinstance(network, Network):
        raise ValueError("strategy_comm_time_s needs a Network (nodes, NVLink, NICs); got a Link")
    g = network.gpus_per_node
    hybrid = normalize_strategy(strategy) == "hybrid_shard"
    seconds = 0.0
    for call in collectives_per_step(strategy, num_params, world_size, group_size=g if hybrid else None):
        if hybrid and call.op == "all_reduce":
            bandwidth = network.node_nic_bytes_per_s / g
        elif call.group_size <= g:
            bandwidth = network.nvlink_bytes_per_s
        else:
            bandwidth = peak_busbw_bytes_per_s(call.group_size, network, "ring")
        seconds += ring_wire_bytes(call.op, call.numel * bytes_per_element, call.group_size) / bandwidth
    return seconds


def comm_time_s(num_params, world_size, network, *, bytes_per_param=4, bucket_cap_bytes=DDP_BUCKET_CAP_BYTES,
                algorithm="nccl"):
    """Seconds of all-reduce per step: one all-reduce per bucket of the num_params gradients."""
    _check_positive("num_params", num_params)
    _check_positive("bytes_per_param", bytes_per_param)
    _check_world_size(world_size)
    if world_size == 1:
        return 0.0
    buckets = bucket_sizes_bytes(num_params * bytes_per_param, bucket_cap_bytes)
    return sum(all_reduce_time_s(b, world_size, network, algorithm) for b in buckets)


def step_time_s(compute_s, comm_s, overlap=0.0):
    """Seconds per step: compute plus the communication that does not hide under overlap * compute."""
    _check_positive("compute_s", compute_s, allow_zero=True)
    _check_positive("comm_s", comm_s, allow_zero=True)
    if not 0 <= overlap <= 1:
        raise ValueError(f"overlap is the fraction of compute that communication can run under, in [0, 1] "
                         f"(DDP: about {BACKWARD_SHARE:.2f}, backward's share); got {overlap!r}")
    return compute_s + max(0.0, comm_s - overlap * compute_s)


def predict_step_time_s(num_params, world_size, compute_s, network, *, overlap=0.0, **comm_options):
    """Seconds per DDP step on world_size GPUs; comm_options go to comm_time_s (bytes_per_param, ...)."""
    comm = comm_time_s(num_params, world_size, network, **comm_options)
    return step_time_s(compute_s, comm, overlap)


def scaling_efficiency(num_params, world_size, compute_s, network, *, weak=True, **step_options):
    """Predicted efficiency at world_size: weak T(1)/T(N) (compute_s per GPU fixed) or strong T(1)/(N T(N)).

    Strong scaling keeps the global batch: compute_s is one GPU's time for all of it, each of N GPUs
    computes compute_s / N (assumed perfectly divisible)."""
    _check_positive("compute_s", compute_s)
    per_gpu = compute_s if weak else compute_s / world_size
    step = predict_step_time_s(num_params, world_size, per_gpu, network, **step_options)
    return per_gpu / step


def measured_efficiency(world_sizes, step_times_s, *, weak):
    """Efficiency from measured step times, relative to the first entry: weak T1/TN, strong T1 N1 / (TN N)."""
    if len(world_sizes) != len(step_times_s) or not world_sizes:
        raise ValueError("measured_efficiency needs one step time per world size, at least one")
    n1, t1 = world_sizes[0], step_times_s[0]
    if weak:
        return [t1 / t for t in step_times_s]
    return [t1 * n1 / (t * n) for n, t in zip(world_sizes, step_times_s)]


__all__ = ["MiB", "DDP_BUCKET_CAP_BYTES", "BACKWARD_SHARE", "NCCL_BASE_S", "NCCL_NVLINK_HOP_S", "NCCL_NET_HOP_S",
           "TREE_EFFICIENCY", "ALGORITHMS", "Link", "Network", "Cost", "ASSUMED_LINKS", "ASSUMED_NETWORKS",
           "link_from_fit", "bucket_sizes_bytes", "algorithm_cost", "nccl_algorithm", "all_reduce_time_s",
           "algbw_bytes_per_s", "busbw_bytes_per_s", "peak_busbw_bytes_per_s", "strategy_comm_time_s",
           "comm_time_s", "step_time_s", "predict_step_time_s", "scaling_efficiency", "measured_efficiency"]
