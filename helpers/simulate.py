"""An alpha-beta simulator of one data-parallel (DDP) training step, to extrapolate past one machine.

Pure functions, no torch; seconds end in _s, bytes in _bytes, bandwidths in _bytes_per_s. Collective
costs come from helpers.theory (collective_time), never re-derived here. The model, whose every
simplification chapter 05 states next to its figures:
- one step = compute_s (forward + backward + optimizer on one GPU's batch) + the gradient all-reduce;
- the num_params * bytes_per_param gradient bytes are all-reduced in buckets of bucket_cap_bytes (the
  last one smaller), one all-reduce each, each paying the full latency. Gradients are treated as
  divisible bytes: DDP keeps whole parameters in a bucket and caps its first bucket at 1 MiB (lab 05);
- overlap: communication runs under a fraction `overlap` of compute_s and adds only what sticks out,
  step = compute_s + max(0, comm_s - overlap * compute_s). DDP overlaps with backward, which is about
  2/3 of forward + backward (backward costs about twice the forward: about 2N FLOPs per token forward,
  6N for training, Kaplan et al. 2020, arXiv 2001.08361, section 2.1; chapter 05 measures its own ratio):
  overlap=2/3. 0 = no overlap;
- a network is a Link (every pair of ranks alike) or a Cluster (gpus_per_node GPUs on `intra` links,
  nodes on `inter` links, one NIC per GPU). A flat ring over several nodes runs at the pace of its
  slowest hop (the inter-node link); 'hierarchical' reduce-scatters inside each node, all-reduces
  each GPU's shard across nodes, then all-gathers inside the node.
Not modelled: tree algorithms (NCCL switches to them at large N), congestion, stragglers, compute
that slows down when the per-GPU batch shrinks.
"""
from numbers import Integral, Real
from typing import NamedTuple

from helpers.theory import collective_time

MiB = 2**20
DDP_BUCKET_CAP_BYTES = 25 * MiB  # torch DDP's default bucket_cap_mb = 25 (MiB)
BACKWARD_SHARE = 2 / 3  # backward's share of forward + backward, the usual rule of thumb (an assumption)


class Link(NamedTuple):
    """One kind of link: per-message latency alpha_s and bandwidth per direction."""

    name: str
    alpha_s: float
    bandwidth_bytes_per_s: float

    @property
    def beta_s_per_byte(self):
        """Seconds per byte: the inverse of the bandwidth."""
        return 1.0 / self.bandwidth_bytes_per_s


class Cluster(NamedTuple):
    """Nodes of gpus_per_node GPUs joined by `intra` links; nodes joined by `inter` (one NIC per GPU)."""

    gpus_per_node: int
    intra: Link
    inter: Link


# ASSUMPTIONS, round figures for illustration, not measurements: replace them with your cluster's
# (e.g. nccl-tests bus bandwidth and small-message latency). Bandwidths are per direction, per GPU.
ASSUMED_LINKS = {
    # NVLink 3 (A100): 12 links x 25 GB/s per direction = 300 GB/s per direction (600 GB/s both ways); NVIDIA,
    # "NVIDIA A100 Tensor Core GPU Architecture" (whitepaper, 2020), section "Third-Generation NVLink".
    "nvlink": Link("NVLink, 300 GB/s, 3 us (assumed)", 3e-6, 300e9),
    # InfiniBand HDR: 200 Gb/s = 25 GB/s per direction, one NIC per GPU.
    "infiniband": Link("InfiniBand 200 Gb/s = 25 GB/s, 10 us (assumed)", 10e-6, 25e9),
    # A 25 Gb/s Ethernet NIC shared by a node's GPUs would be far worse; per GPU here for comparison.
    "ethernet": Link("Ethernet 25 Gb/s = 3.1 GB/s, 30 us (assumed)", 30e-6, 25e9 / 8),
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


def _ring(op, size_bytes, world_size, link):
    return collective_time(op, size_bytes, world_size, link.alpha_s, link.beta_s_per_byte)


def all_reduce_time_s(size_bytes, world_size, network, algorithm="ring"):
    """Seconds of one all-reduce of size_bytes over world_size GPUs of `network` (a Link or a Cluster)."""
    _check_world_size(world_size)
    if algorithm not in ("ring", "hierarchical"):
        raise ValueError(f"algorithm must be 'ring' or 'hierarchical'; got {algorithm!r}")
    if isinstance(network, Link):
        return _ring("all_reduce", size_bytes, world_size, network)
    g = network.gpus_per_node
    if world_size <= g:  # inside one node
        return _ring("all_reduce", size_bytes, world_size, network.intra)
    if algorithm == "ring":  # every step waits for its slowest hop, an inter-node one
        return _ring("all_reduce", size_bytes, world_size, network.inter)
    if world_size % g:
        raise ValueError(f"hierarchical all-reduce needs whole nodes: world_size={world_size} is not a "
                         f"multiple of gpus_per_node={g}")
    nodes = world_size // g
    # reduce-scatter in the node, all-reduce of each GPU's 1/g shard across nodes (g of them in parallel,
    # one per NIC), all-gather in the node.
    return (_ring("reduce_scatter", size_bytes, g, network.intra)
            + _ring("all_reduce", size_bytes / g, nodes, network.inter)
            + _ring("all_gather", size_bytes, g, network.intra))


def comm_time_s(num_params, world_size, network, *, bytes_per_param=4, bucket_cap_bytes=DDP_BUCKET_CAP_BYTES,
                algorithm="ring"):
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


__all__ = ["MiB", "DDP_BUCKET_CAP_BYTES", "BACKWARD_SHARE", "Link", "Cluster", "ASSUMED_LINKS", "link_from_fit",
           "bucket_sizes_bytes", "all_reduce_time_s", "comm_time_s", "step_time_s", "predict_step_time_s",
           "scaling_efficiency", "measured_efficiency"]
