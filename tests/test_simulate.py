"""helpers.simulate: the alpha-beta step-time simulator, against helpers.theory and its own invariants."""
import pytest

from helpers import simulate
from helpers.simulate import (
    ASSUMED_LINKS,
    DDP_BUCKET_CAP_BYTES,
    Cluster,
    Link,
    MiB,
    all_reduce_time_s,
    bucket_sizes_bytes,
    comm_time_s,
    link_from_fit,
    measured_efficiency,
    predict_step_time_s,
    scaling_efficiency,
    step_time_s,
)
from helpers.theory import collective_time, fit_alpha_beta, ring_all_reduce_time

FAST = Link("fast", 3e-6, 300e9)
SLOW = Link("slow", 10e-6, 25e9)
CLUSTER = Cluster(8, FAST, SLOW)


def test_assumed_links_are_the_stated_figures():
    assert ASSUMED_LINKS["nvlink"].bandwidth_bytes_per_s == 300e9
    assert ASSUMED_LINKS["infiniband"].bandwidth_bytes_per_s == 200e9 / 8  # 200 Gb/s = 25 GB/s
    assert all("assumed" in link.name for link in ASSUMED_LINKS.values())
    assert DDP_BUCKET_CAP_BYTES == 25 * 2**20


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


def test_cluster_inside_a_node_uses_the_fast_link():
    for n in (1, 2, 8):
        assert all_reduce_time_s(4e6, n, CLUSTER) == ring_all_reduce_time(4e6, n, FAST.alpha_s, FAST.beta_s_per_byte)


def test_flat_ring_across_nodes_runs_at_the_slow_link():
    assert all_reduce_time_s(4e6, 64, CLUSTER) == ring_all_reduce_time(4e6, 64, SLOW.alpha_s, SLOW.beta_s_per_byte)


def test_hierarchical_is_reduce_scatter_all_reduce_all_gather():
    s, n, g = 8e6, 32, 8
    expected = (collective_time("reduce_scatter", s, g, FAST.alpha_s, FAST.beta_s_per_byte)
                + ring_all_reduce_time(s / g, n // g, SLOW.alpha_s, SLOW.beta_s_per_byte)
                + collective_time("all_gather", s, g, FAST.alpha_s, FAST.beta_s_per_byte))
    assert all_reduce_time_s(s, n, CLUSTER, "hierarchical") == pytest.approx(expected, rel=1e-12)
    assert all_reduce_time_s(s, n, CLUSTER, "hierarchical") < all_reduce_time_s(s, n, CLUSTER, "ring")


def test_hierarchical_needs_whole_nodes():
    with pytest.raises(ValueError, match="multiple of gpus_per_node"):
        all_reduce_time_s(1e6, 12, CLUSTER, "hierarchical")
    with pytest.raises(ValueError, match="'ring' or 'hierarchical'"):
        all_reduce_time_s(1e6, 16, CLUSTER, "tree")


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
    comm = comm_time_s(1.5e9, 64, CLUSTER, bytes_per_param=2)
    assert predict_step_time_s(1.5e9, 64, 0.5, CLUSTER, bytes_per_param=2) == pytest.approx(0.5 + comm)
    assert predict_step_time_s(1.5e9, 1, 0.5, CLUSTER) == 0.5


def test_scaling_efficiency_weak_and_strong():
    kwargs = dict(bytes_per_param=2, overlap=2 / 3)
    assert scaling_efficiency(1e9, 1, 0.5, CLUSTER, **kwargs) == 1.0
    for n in (8, 64, 1024):
        weak = scaling_efficiency(1e9, n, 0.5, CLUSTER, **kwargs)
        strong = scaling_efficiency(1e9, n, 0.5 * n, CLUSTER, weak=False, **kwargs)
        assert weak == pytest.approx(strong)  # the same per-GPU compute, so the same step
        assert scaling_efficiency(1e9, n, 0.5, CLUSTER, weak=False, **kwargs) <= weak
    effs = [scaling_efficiency(1e9, n, 0.5, CLUSTER, **kwargs) for n in (8, 16, 64, 256, 1024)]
    assert effs == sorted(effs, reverse=True)


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
