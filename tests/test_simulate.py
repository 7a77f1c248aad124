"""helpers.simulate: the alpha-beta step-time simulator, against helpers.theory and its own invariants."""
import pytest

from helpers import simulate
from helpers.simulate import (
    ASSUMED_LINKS,
    ASSUMED_NETWORKS,
    DDP_BUCKET_CAP_BYTES,
    NCCL_BASE_S,
    NCCL_NET_HOP_S,
    NCCL_NVLINK_HOP_S,
    TREE_EFFICIENCY,
    Link,
    MiB,
    Network,
    algbw_bytes_per_s,
    algorithm_cost,
    all_reduce_time_s,
    bucket_sizes_bytes,
    busbw_bytes_per_s,
    comm_time_s,
    link_from_fit,
    measured_efficiency,
    nccl_algorithm,
    peak_busbw_bytes_per_s,
    predict_step_time_s,
    scaling_efficiency,
    step_time_s,
    strategy_comm_time_s,
)
from helpers.theory import fit_alpha_beta, ring_all_reduce_time

SLOW = Link("slow", 10e-6, 25e9)
DGX = ASSUMED_NETWORKS["dgx_a100"]
ONE_NIC = ASSUMED_NETWORKS["a100_one_nic"]


def test_assumed_links_are_the_stated_figures():
    assert ASSUMED_LINKS["nvlink"].bandwidth_bytes_per_s == 300e9
    assert ASSUMED_LINKS["infiniband"].bandwidth_bytes_per_s == 200e9 / 8  # 200 Gb/s = 25 GB/s
    assert all("assumed" in link.name for link in ASSUMED_LINKS.values())
    assert DDP_BUCKET_CAP_BYTES == 25 * 2**20


def test_assumed_networks_and_nccl_constants_are_the_stated_figures():
    assert (DGX.gpus_per_node, DGX.nvlink_bytes_per_s, DGX.nics_per_node, DGX.nic_bytes_per_s) == (8, 300e9, 8, 25e9)
    assert ONE_NIC._replace(name=DGX.name, nics_per_node=8) == DGX
    assert all("assumed" in network.name for network in ASSUMED_NETWORKS.values())
    # NVIDIA/nccl:src/graph/tuning.cc, Simple protocol: ring base 8.4 us, NVLink hop 3.4 us, network hop 14 us
    assert (NCCL_BASE_S, NCCL_NVLINK_HOP_S, NCCL_NET_HOP_S, TREE_EFFICIENCY) == (8.4e-6, 3.4e-6, 14e-6, 0.92)
    assert (DGX.base_s, DGX.intra_hop_s, DGX.inter_hop_s) == (NCCL_BASE_S, NCCL_NVLINK_HOP_S, NCCL_NET_HOP_S)


def test_pure_no_torch():
    assert "torch" not in vars(simulate)


@pytest.mark.parametrize("total, cap, expected", [
    (100, 40, [40, 40, 20]), (80, 40, [40, 40]), (10, 40, [10]), (0, 40, []), (100, None, [100]),
])
def test_bucket_sizes(total, cap, expected):
    assert bucket_sizes_bytes(total, cap) == expected


def test_bucket_sizes_rejects_bad_input():
    with pytest.raises(ValueError, match="bucket_cap_bytes"):
        bucket_sizes_bytes(100, 0)
    with pytest.raises(ValueError, match="total_bytes"):
        bucket_sizes_bytes(-1)


def test_a_link_is_the_ring_formula():
    assert all_reduce_time_s(4e6, 16, SLOW) == ring_all_reduce_time(4e6, 16, SLOW.alpha_s, SLOW.beta_s_per_byte)


def test_one_node_ring_is_the_alpha_beta_ring_plus_the_base_latency():
    s = 4e6
    for n in (2, 5, 8):
        expected = DGX.base_s + ring_all_reduce_time(s, n, DGX.intra_hop_s, 1 / DGX.nvlink_bytes_per_s)
        assert all_reduce_time_s(s, n, DGX, "ring") == pytest.approx(expected, rel=1e-12)


def test_a_ring_across_nodes_runs_at_all_the_nodes_nics_not_one():
    assert DGX.node_nic_bytes_per_s == 200e9
    for n in (16, 64, 1024):
        assert peak_busbw_bytes_per_s(n, DGX, "ring") == pytest.approx(200e9)  # min(NVLink 300, 8 x 25)
        assert peak_busbw_bytes_per_s(n, ONE_NIC, "ring") == pytest.approx(25e9)
    # NVLink is the bottleneck when the NICs add up to more than it
    fat = DGX._replace(nics_per_node=16)
    assert peak_busbw_bytes_per_s(64, fat, "ring") == pytest.approx(300e9)


def test_ring_latency_counts_intra_and_inter_node_hops():
    n, nodes = 64, 8
    expected = DGX.base_s + 2 * (n - nodes) * DGX.intra_hop_s + 2 * (nodes - 1) * DGX.inter_hop_s
    assert algorithm_cost("ring", n, DGX).latency_s == pytest.approx(expected, rel=1e-12)


def test_tree_latency_grows_with_log2_of_the_nodes_and_the_ring_linearly():
    tree = [algorithm_cost("tree", 8 * nodes, DGX).latency_s for nodes in (2, 4, 8, 16, 128)]
    steps = [b - a for a, b in zip(tree, tree[1:])]
    assert steps[:3] == pytest.approx([2 * DGX.inter_hop_s] * 3)   # one more level per doubling
    assert tree[-1] - tree[0] == pytest.approx(2 * 6 * DGX.inter_hop_s)
    ring = algorithm_cost("ring", 1024, DGX).latency_s
    assert ring > 30 * tree[-1]


def test_tree_moves_2s_per_gpu_and_per_node_at_tree_efficiency():
    cost = algorithm_cost("tree", 64, DGX)
    assert cost.seconds_per_byte == pytest.approx(max(2 / 300e9, 2 / 200e9) / TREE_EFFICIENCY)
    # two nodes: each is the other's only neighbour, S crosses the network, so NVLink (2S) decides
    two = algorithm_cost("tree", 16, DGX)
    assert two.seconds_per_byte == pytest.approx(2 / 300e9 / TREE_EFFICIENCY)
    assert peak_busbw_bytes_per_s(16, DGX, "tree") > 1.25 * DGX.node_nic_bytes_per_s  # the "tree effect" on 2 nodes
    assert peak_busbw_bytes_per_s(16, DGX, "ring") == pytest.approx(DGX.node_nic_bytes_per_s)


def test_nccl_takes_the_faster_of_ring_and_tree():
    for n in (8, 16, 64, 1024):
        for size in (2**10, 2**20, 25 * MiB, 2**30, 2**34):
            times = {a: all_reduce_time_s(size, n, DGX, a) for a in ("ring", "tree")}
            assert all_reduce_time_s(size, n, DGX) == min(times.values())
            assert nccl_algorithm(size, n, DGX) == min(times, key=times.get)
    assert nccl_algorithm(2**10, 8, DGX) == "ring"          # one node: the tree is a chain, no faster
    assert nccl_algorithm(25 * MiB, 64, DGX) == "tree"      # latency-bound: log2 beats linear
    assert nccl_algorithm(2**30, 64, DGX) == "ring"         # bandwidth-bound: the ring is bandwidth-optimal


def test_hierarchical_is_reduce_scatter_all_reduce_all_gather():
    s, n, g = 8e6, 32, 8
    nodes = n // g
    expected = (3 * DGX.base_s + 2 * (g - 1) * DGX.intra_hop_s + 2 * (nodes - 1) * DGX.inter_hop_s
                + 2 * (g - 1) / g * s / 300e9                       # reduce-scatter + all-gather on NVLink
                + 2 * (nodes - 1) / nodes * (s / g) / (200e9 / g))  # g all-reduces of S/g share the NICs
    assert all_reduce_time_s(s, n, DGX, "hierarchical") == pytest.approx(expected, rel=1e-12)


def test_hierarchical_saves_latency_not_bandwidth_when_the_ring_uses_every_nic():
    ring, hier = (algorithm_cost(a, 1024, DGX) for a in ("ring", "hierarchical"))
    assert hier.latency_s < ring.latency_s / 2
    assert hier.seconds_per_byte > ring.seconds_per_byte    # the in-node phases add NVLink time
    # with one NIC per node both are NIC-bound and move about the same bytes through it: within 10%, not 8x
    for n in (64, 1024):
        ratio = (algorithm_cost("hierarchical", n, ONE_NIC).seconds_per_byte
                 / algorithm_cost("ring", n, ONE_NIC).seconds_per_byte)
        assert 0.9 < ratio < 1.1


def test_hierarchical_needs_whole_nodes():
    with pytest.raises(ValueError, match="multiple of gpus_per_node"):
        all_reduce_time_s(1e6, 12, DGX, "hierarchical")
    with pytest.raises(ValueError, match="algorithm must be one of"):
        all_reduce_time_s(1e6, 16, DGX, "butterfly")
    with pytest.raises(ValueError, match="a Link has no nodes"):
        all_reduce_time_s(1e6, 16, SLOW, "tree")
    with pytest.raises(ValueError, match="nccl_algorithm"):
        algorithm_cost("nccl", 16, DGX)


def test_bad_networks_are_refused():
    with pytest.raises(ValueError, match="nics_per_node"):
        all_reduce_time_s(1e6, 16, DGX._replace(nics_per_node=0))
    with pytest.raises(ValueError, match="nic_bytes_per_s"):
        all_reduce_time_s(1e6, 16, DGX._replace(nic_bytes_per_s=-1.0))
    with pytest.raises(ValueError, match="Link or Network"):
        all_reduce_time_s(1e6, 16, "dgx")


def test_bus_bandwidth_is_nccl_tests_definition():
    # NVIDIA/nccl#1368: 1 MiB all-reduce on 40 ranks in 354.9 us, printed as algbw 2.95 GB/s, busbw 5.76 GB/s
    size, t, n = 2**20, 354.9e-6, 40
    assert round(algbw_bytes_per_s(size, t) / 1e9, 2) == 2.95
    assert round(busbw_bytes_per_s("all_reduce", size, t, n) / 1e9, 2) == 5.76
    assert busbw_bytes_per_s("all_reduce", size, t, n) == pytest.approx(algbw_bytes_per_s(size, t) * 2 * 39 / 40)
    assert busbw_bytes_per_s("all_gather", size, t, n) == pytest.approx(algbw_bytes_per_s(size, t) * 39 / 40)


# Chapter 05's calibration: published nccl-tests figures for named systems, and what the model predicts for them.
# (network, world_size, algorithm, size_bytes or None for the peak, metric, published, predicted, bound on |error|)
H100_ROCE = Network("5 x (8 H100, 4 x 400 Gb/s RoCE)", 8, 450e9, 4, 50e9)
CALIBRATION = [
    (Network("DGX A100", 8, 300e9, 8, 25e9), 16, "ring", None, "busbw", 192e9, 200e9, 0.05),
    (Network("DGX-1 (V100)", 8, 150e9, 4, 12.5e9), 16, "ring", None, "busbw", 48e9, 50e9, 0.05),
    (Network("A800, 1 x HDR", 8, 160e9, 1, 25e9), 96, "ring", 8 * 2**30, "busbw", 24e9, 24.96741193273424e9, 0.05),
    (Network("HGX H100, one node", 8, 450e9, 8, 50e9), 8, "ring", None, "busbw", 370e9, 450e9, 0.25),
    (H100_ROCE, 40, "ring", 2**30, "busbw", 190e9, 193.37974823371684e9, 0.05),
    (H100_ROCE, 40, "ring", 2**20, "time", 354.9e-6, 368.623616e-6, 0.05),
    (H100_ROCE, 40, "tree", 2**30, "busbw", 150e9, 177.6947790959804e9, 0.20),
]


@pytest.mark.parametrize("case", CALIBRATION, ids=lambda c: f"{c[0].name}, {c[2]}, {c[4]}")
def test_calibration_predictions_are_pinned_and_within_their_bounds(case):
    network, n, algorithm, size, metric, published, predicted, bound = case
    if size is None:
        got = peak_busbw_bytes_per_s(n, network, algorithm)
    else:
        t = all_reduce_time_s(size, n, network, algorithm)
        got = t if metric == "time" else busbw_bytes_per_s("all_reduce", size, t, n)
    assert got == pytest.approx(predicted, rel=1e-9)
    assert abs(got / published - 1) < bound


def test_a_one_nic_ring_misses_multi_nic_systems_by_far():
    # The model this replaced ran a ring across nodes at one NIC's bandwidth: 25 GB/s on a DGX A100, which
    # NVIDIA measures at 192 GB/s (NVIDIA/nccl#812).
    one_nic = Link("one NIC per ring", 10e-6, 25e9)
    t = all_reduce_time_s(2**30, 16, one_nic)
    assert busbw_bytes_per_s("all_reduce", 2**30, t, 16) / 192e9 - 1 < -0.85


def test_strategy_comm_time_puts_each_collective_on_its_links():
    psi, n = 1e9, 32   # bf16: 2 GB of parameters on 4 DGX A100-like nodes
    ddp = 2 * 31 / 32 * 2e9 / 200e9                     # the whole world: min(NVLink 300, 8 NICs x 25)
    assert strategy_comm_time_s("ddp", psi, n, DGX) == pytest.approx(ddp, rel=1e-12)
    assert strategy_comm_time_s("zero2", psi, n, DGX) == pytest.approx(ddp, rel=1e-12)
    assert strategy_comm_time_s("full_shard", psi, n, DGX) == pytest.approx(1.5 * ddp, rel=1e-12)
    hybrid = 3 * 7 / 8 * 2e9 / 300e9 + 2 * 3 / 4 * (2e9 / 8) / (200e9 / 8)   # in-node x 3, then S/8 over 4 nodes
    assert strategy_comm_time_s("hybrid_shard", psi, n, DGX) == pytest.approx(hybrid, rel=1e-12)
    # with a NIC per GPU, rings over all GPUs beat HSDP; with one NIC per node HSDP wins
    assert strategy_comm_time_s("ddp", psi, n, DGX) < strategy_comm_time_s("full_shard", psi, n, DGX) < hybrid
    one = {s: strategy_comm_time_s(s, psi, n, ONE_NIC) for s in ("ddp", "full_shard", "hybrid_shard")}
    assert one["hybrid_shard"] < one["ddp"] < one["full_shard"]
    with pytest.raises(ValueError, match="needs a Network"):
        strategy_comm_time_s("ddp", psi, n, SLOW)


def test_comm_time_sums_one_all_reduce_per_bucket():
    num_params, n = 3e7, 16  # 120 MB of fp32 gradients: 4 full buckets and a rest
    buckets = bucket_sizes_bytes(num_params * 4)
    assert len(buckets) == 5
    expected = sum(ring_all_reduce_time(b, n, SLOW.alpha_s, SLOW.beta_s_per_byte) for b in buckets)
    assert comm_time_s(num_params, n, SLOW) == pytest.approx(expected, rel=1e-12)
    assert comm_time_s(num_params, 1, SLOW) == 0.0
    # one big bucket pays the latency once
    assert comm_time_s(num_params, n, SLOW, bucket_cap_bytes=None) < comm_time_s(num_params, n, SLOW)


def test_step_time_overlap():
    assert step_time_s(1.0, 0.5, overlap=0.0) == 1.5
    assert step_time_s(1.0, 0.5, overlap=2 / 3) == 1.0           # hidden under the backward
    assert step_time_s(1.0, 2.0, overlap=1.0) == 2.0             # max(compute, comm)
    assert step_time_s(1.0, 2.0, overlap=0.5) == pytest.approx(2.5)
    with pytest.raises(ValueError, match="overlap"):
        step_time_s(1.0, 1.0, overlap=1.5)


def test_predicted_step_is_compute_plus_comm():
    comm = comm_time_s(1.5e9, 64, DGX, bytes_per_param=2)
    assert predict_step_time_s(1.5e9, 64, 0.5, DGX, bytes_per_param=2) == pytest.approx(0.5 + comm)
    assert predict_step_time_s(1.5e9, 1, 0.5, DGX) == 0.5
    # the default algorithm is NCCL's choice, bucket by bucket
    assert comm == pytest.approx(sum(all_reduce_time_s(b, 64, DGX, nccl_algorithm(b, 64, DGX))
                                     for b in bucket_sizes_bytes(3e9)), rel=1e-12)


def test_scaling_efficiency_weak_and_strong():
    kwargs = dict(bytes_per_param=2, overlap=2 / 3)
    assert scaling_efficiency(1e9, 1, 0.1, ONE_NIC, **kwargs) == 1.0
    for n in (8, 64, 1024):
        weak = scaling_efficiency(1e9, n, 0.1, ONE_NIC, **kwargs)
        strong = scaling_efficiency(1e9, n, 0.1 * n, ONE_NIC, weak=False, **kwargs)
        assert weak == pytest.approx(strong)  # the same per-GPU compute, so the same step
        assert scaling_efficiency(1e9, n, 0.1, ONE_NIC, weak=False, **kwargs) <= weak
    effs = [scaling_efficiency(1e9, n, 0.1, ONE_NIC, **kwargs) for n in (8, 16, 64, 256, 1024)]
    assert effs == sorted(effs, reverse=True) and effs[-1] < 0.9


def test_measured_efficiency():
    assert measured_efficiency([1, 2, 4], [1.0, 0.5, 0.5], weak=False) == [1.0, 1.0, 0.5]
    assert measured_efficiency([1, 2, 4], [1.0, 1.0, 2.0], weak=True) == [1.0, 1.0, 0.5]
    with pytest.raises(ValueError):
        measured_efficiency([1, 2], [1.0], weak=True)


def test_link_from_fit_round_trip():
    sizes = [2**k for k in range(10, 24, 2)]
    times = [ring_all_reduce_time(s, 2, 3e-4, 1e-9) for s in sizes]
    link = link_from_fit("fitted", *fit_alpha_beta(sizes, times, world_size=2, op="all_reduce"))
    assert link.alpha_s == pytest.approx(3e-4, rel=1e-6)
    assert link.bandwidth_bytes_per_s == pytest.approx(1e9, rel=1e-6)
    assert link.beta_s_per_byte == pytest.approx(1e-9, rel=1e-6)


def test_bad_world_size():
    with pytest.raises(ValueError, match="world_size"):
        comm_time_s(1e6, 0, SLOW)
    assert MiB == 2**20
