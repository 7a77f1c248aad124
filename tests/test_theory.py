"""helpers.theory against the published figures (ZeRO paper, arXiv 1910.02054) and against its own invariants."""
import enum

import numpy as np
import pytest

from helpers import theory, theory_comm
from helpers.theory import (
    CONVENTIONS,
    GB,
    GiB,
    collectives_per_step,
    comm_breakdown,
    comm_volume,
    fit_alpha_beta,
    fsdp_paper_cross_host_elements,
    max_num_params,
    naive_all_reduce_time,
    optimizer_k,
    ring_all_gather_time,
    ring_all_reduce_time,
    ring_reduce_scatter_time,
    ring_wire_bytes,
    strategy_memory,
    unchunked_ring_all_reduce_time,
    zero_memory,
)

PSI = 7.5e9  # ZeRO paper Figure 1


# --- memory: ZeRO paper ---------------------------------------------------------------------------

def test_units():
    assert GB == 10**9 and GiB == 1024**3


@pytest.mark.parametrize("stage, total_gb", [(0, 120), (1, 31.40625), (2, 16.640625), (3, 1.875)])
def test_zero_figure_1(stage, total_gb):
    assert zero_memory(PSI, 64, stage)["total"] / GB == pytest.approx(total_gb, rel=1e-12)


def test_zero_figure_1_categories():
    # Paper 3.1/5: DDP 2+2+12 Psi; ZeRO-1 4 Psi + 12 Psi/Nd; ZeRO-2 2 Psi + 14 Psi/Nd; ZeRO-3 16 Psi/Nd.
    nd = 64
    assert zero_memory(PSI, nd, 0) == pytest.approx(
        {"params": 2 * PSI, "grads": 2 * PSI, "optimizer": 12 * PSI, "total": 16 * PSI})
    assert zero_memory(PSI, nd, 1) == pytest.approx(
        {"params": 2 * PSI, "grads": 2 * PSI, "optimizer": 12 * PSI / nd, "total": 4 * PSI + 12 * PSI / nd})
    assert zero_memory(PSI, nd, 2) == pytest.approx(
        {"params": 2 * PSI, "grads": 2 * PSI / nd, "optimizer": 12 * PSI / nd,
         "total": 2 * PSI + 14 * PSI / nd})
    assert zero_memory(PSI, nd, 3)["total"] == pytest.approx(16 * PSI / nd)


def test_one_device_shards_nothing():
    totals = {zero_memory(PSI, 1, stage)["total"] for stage in range(4)}
    assert totals == {16 * PSI}


# Section 5.4, Nd = 64, 32 GB: the paper's rounded figures must fit, and be within 10% of the maximum.
@pytest.mark.parametrize("stage, paper_params, exact_max", [
    (1, 7.5e9, 32e9 / (4 + 12 / 64)),   # 7.6418e9: the paper rounds down to 7.5B
    (2, 14e9, 32e9 / (2 + 14 / 64)),    # 14.4225e9
    (3, 128e9, 128e9),                  # exact: 16 * 128e9 / 64 = 32e9
])
def test_zero_section_5_4_max_model(stage, paper_params, exact_max):
    largest = max_num_params(32 * GB, 64, stage)
    assert largest == pytest.approx(exact_max, rel=1e-12)
    assert paper_params <= largest < 1.1 * paper_params
    assert zero_memory(paper_params, 64, stage)["total"] <= 32 * GB


def test_zero_section_5_4_trillion_on_1024():
    assert zero_memory(1e12, 1024, 3)["total"] / GB == pytest.approx(15.625)  # fits 32 GB
    assert max_num_params(32 * GB, 1024, 3) == pytest.approx(2.048e12)
    assert zero_memory(1e12, 1024, 2)["total"] > 32 * GB  # ZeRO-2 keeps full fp16 params: 2 TB


def test_gpt2_model_states():
    assert zero_memory(1.5e9, 1, 0)["total"] / GB == pytest.approx(24)
    assert zero_memory(1.5e9, 1, 0, **CONVENTIONS["fp32_grads"])["total"] / GB == pytest.approx(27)


def test_max_num_params_inverts_zero_memory():
    for name, convention in CONVENTIONS.items():
        for stage in range(4):
            n = max_num_params(80 * GB, 8, stage, **convention)
            assert zero_memory(n, 8, stage, **convention)["total"] == pytest.approx(80 * GB), name


# --- conventions and optimizers --------------------------------------------------------------------

@pytest.mark.parametrize("name, bytes_per_param", [
    ("zero_paper_mixed_adam", 16), ("fp32_grads", 18), ("fp32_grad_accum", 20), ("fp32_adam", 16)])
def test_conventions_bytes_per_param(name, bytes_per_param):
    assert zero_memory(1, 1, 0, **CONVENTIONS[name])["total"] == bytes_per_param


def test_stage_2_shards_the_fp32_accumulation_buffer_with_the_gradients():
    assert zero_memory(8e9, 8, 2, **CONVENTIONS["fp32_grad_accum"])["grads"] == 6e9


def test_optimizer_k():
    # Mixed precision keeps a 4-byte fp32 master copy; pure fp32 training updates params in place.
    assert optimizer_k("adam") == CONVENTIONS["zero_paper_mixed_adam"]["k"] == 12
    assert optimizer_k("adam", master_weights=False) == CONVENTIONS["fp32_adam"]["k"] == 8
    assert optimizer_k("sgd_momentum") == 8
    assert optimizer_k("sgd") == 4
    assert optimizer_k("sgd", master_weights=False) == 0


# --- errors in popular material (chapter 06, section 6) -------------------------------------------

def test_10b_params_optimizer_120_total_160():
    memory = zero_memory(10e9, 1, 0)
    assert memory["optimizer"] / GB == pytest.approx(120)  # not 60
    assert memory["total"] / GB == pytest.approx(160)  # not 100


def test_70b_on_8_gpus_zero2_is_227_5():
    # Inputs 140 GB params, 140 GB grads, 560 GB Adam at 70B = 2 + 2 + 8 bytes per parameter.
    memory = zero_memory(70e9, 8, 2, k=8)
    assert (memory["params"], memory["grads"], memory["optimizer"]) == pytest.approx(
        (140 * GB, 140 * GB / 8, 560 * GB / 8))
    assert memory["total"] / GB == pytest.approx(227.5)  # not 210
    assert memory["total"] / GB != pytest.approx(210)


# --- strategies ------------------------------------------------------------------------------------

class ShardingStrategy(enum.Enum):  # stands in for torch's enum without importing FSDP
    FULL_SHARD = 1
    SHARD_GRAD_OP = 2


def test_fsdp_names_map_to_zero_stages():
    assert strategy_memory(PSI, 64, "NO_SHARD") == zero_memory(PSI, 64, 0)
    assert strategy_memory(PSI, 64, ShardingStrategy.SHARD_GRAD_OP) == zero_memory(PSI, 64, 2)
    assert strategy_memory(PSI, 64, "full_shard") == zero_memory(PSI, 64, 3)
    assert strategy_memory(PSI, 64, "ZeRO-1") == zero_memory(PSI, 64, 1)
    # HSDP shards within its group only: 64 ranks in groups of 8 hold what ZeRO-3 on 8 ranks holds.
    assert strategy_memory(PSI, 64, "hybrid_shard", group_size=8) == zero_memory(PSI, 8, 3)


# --- communication --------------------------------------------------------------------------------

def test_logical_volume_zero_paper_section_7():
    ddp = comm_volume("ddp", PSI, 64)
    assert ddp == pytest.approx(2 * PSI)
    assert comm_volume("zero1", PSI, 64) == comm_volume("zero2", PSI, 64) == ddp
    assert comm_volume("shard_grad_op", PSI, 64) == ddp
    assert comm_volume("zero3", PSI, 64) == comm_volume("full_shard", PSI, 64) == 1.5 * ddp


def test_breakdown_op_by_op():
    psi, n = 1000, 4
    assert comm_breakdown("ddp", psi, n, kind="payload") == {
        "all_gather": 0, "reduce_scatter": 0, "all_reduce": psi}
    assert comm_breakdown("zero2", psi, n, kind="payload") == {
        "all_gather": psi, "reduce_scatter": psi, "all_reduce": 0}
    assert comm_breakdown("full_shard", psi, n, kind="payload") == {
        "all_gather": 2 * psi, "reduce_scatter": psi, "all_reduce": 0}
    # Ring wire bytes per rank, fp32: all_gather and reduce_scatter (N-1)/N S, all_reduce 2 (N-1)/N S.
    assert comm_breakdown("full_shard", psi, n, bytes_per_element=4) == pytest.approx(
        {"all_gather": 2 * 0.75 * 4 * psi, "reduce_scatter": 0.75 * 4 * psi, "all_reduce": 0})
    assert comm_breakdown("ddp", psi, n, bytes_per_element=4)["all_reduce"] == pytest.approx(
        2 * 0.75 * 4 * psi)


def test_shard_grad_op_gathers_once_before_forward():
    calls = collectives_per_step("shard_grad_op", 10, 2)
    assert [(c.op, c.phase) for c in calls] == [("all_gather", "forward"), ("reduce_scatter", "backward")]
    full = collectives_per_step("full_shard", 10, 2)
    assert [(c.op, c.phase) for c in full if c.op == "all_gather"] == [
        ("all_gather", "forward"), ("all_gather", "backward")]


@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_ring_wire_bytes(n):
    s = 12_000
    assert ring_wire_bytes("all_reduce", s, n) == pytest.approx(2 * (n - 1) / n * s)
    assert ring_wire_bytes("all_gather", s, n) == pytest.approx((n - 1) / n * s)
    assert ring_wire_bytes("reduce_scatter", s, n) == pytest.approx((n - 1) / n * s)
    assert ring_wire_bytes("unchunked_ring_all_reduce", s, n) == (n - 1) * s
    # Wire = logical x (N-1)/N for every strategy.
    for strategy in ("ddp", "zero1", "zero3", "shard_grad_op"):
        assert comm_volume(strategy, s, n, kind="wire") == pytest.approx(
            comm_volume(strategy, s, n) * (n - 1) / n)


def test_hybrid_shard_traffic():
    m, w, g = 8e9, 64, 8  # 8 hosts of 8 GPUs, shard group = host
    wire = comm_breakdown("hybrid_shard", m, w, group_size=g)
    replicas = w // g
    assert wire["all_gather"] == pytest.approx(2 * m * (g - 1) / g)  # stays inside the host
    assert wire["reduce_scatter"] == pytest.approx(m * (g - 1) / g)
    # The only cross-host collective: all_reduce of a 1/G gradient shard over the W/G replicas.
    assert wire["all_reduce"] == pytest.approx(2 * (m / g) * (replicas - 1) / replicas)
    assert wire["all_reduce"] == pytest.approx(2 * m * (w - g) / (g * w))


def test_fsdp_paper_cross_host_formulas():
    m, w, g = 8e9, 1024, 8
    assert fsdp_paper_cross_host_elements("ddp", m, w, g) == pytest.approx(2 * m * (w - 1) / w)
    assert fsdp_paper_cross_host_elements("full_shard", m, w, g) == pytest.approx(3 * m * (w - 1) / w)
    paper_hybrid = fsdp_paper_cross_host_elements("hybrid_shard", m, w, g)
    assert paper_hybrid == pytest.approx(2 * m * (w - 1) / (g * w))
    # The paper's figure bounds the exact ring count from above and agrees with it when W >> G.
    exact = comm_breakdown("hybrid_shard", m, w, group_size=g)["all_reduce"]
    assert exact <= paper_hybrid <= 1.01 * exact
    assert fsdp_paper_cross_host_elements("ddp", m, w, g) / paper_hybrid == pytest.approx(g)


# --- alpha-beta ------------------------------------------------------------------------------------

def test_alpha_beta_times():
    alpha, beta, s = 1e-5, 1e-9, 1e6
    assert ring_all_reduce_time(s, 4, alpha, beta) == pytest.approx(6 * alpha + 1.5 * s * beta)
    assert ring_all_gather_time(s, 4, alpha, beta) == pytest.approx(3 * alpha + 0.75 * s * beta)
    assert ring_reduce_scatter_time(s, 4, alpha, beta) == pytest.approx(3 * alpha + 0.75 * s * beta)
    assert naive_all_reduce_time(s, 4, alpha, beta) == pytest.approx(6 * (alpha + s * beta))
    assert unchunked_ring_all_reduce_time(s, 4, alpha, beta) == pytest.approx(3 * (alpha + s * beta))


def test_ring_bandwidth_term_stays_near_2s_while_latency_grows():
    s = 1e9
    bandwidth = [ring_all_reduce_time(s, n, 0, 1.0) for n in (2, 8, 64, 1024)]
    assert bandwidth == pytest.approx([s, 1.75 * s, 2 * 63 / 64 * s, 2 * 1023 / 1024 * s])
    assert ring_all_reduce_time(0, 1024, 1.0, 0) == 2 * 1023


@pytest.mark.parametrize("op, n", [("send", 2), ("all_reduce", 4), ("all_gather", 3)])
def test_fit_alpha_beta_recovers_synthetic_parameters(op, n):
    alpha, beta = 2e-5, 4e-10
    sizes = np.logspace(3, 8, 12)
    times = np.array([theory.collective_time(op, s, n, alpha, beta) for s in sizes])
    assert fit_alpha_beta(sizes, times, world_size=n, op=op) == pytest.approx((alpha, beta), rel=1e-9)
    # 1% timing noise: the relative-error fit keeps the latency term although sizes span 5 decades.
    noise = 1 + 0.01 * np.random.default_rng(0).standard_normal(sizes.shape)
    assert fit_alpha_beta(sizes, times * noise, world_size=n, op=op) == pytest.approx(
        (alpha, beta), rel=0.02)


# --- input validation -----------------------------------------------------------------------------

@pytest.mark.parametrize("call, message", [
    (lambda: zero_memory(-1, 8, 3), r"num_params must be > 0, e\.g\. 7\.5e9"),
    (lambda: zero_memory("7.5B", 8, 3), r"num_params must be a number, e\.g\. 7\.5e9.*'7\.5B'"),
    (lambda: zero_memory(PSI, 0, 3), r"dp must be an integer >= 1"),
    (lambda: zero_memory(PSI, 2.5, 3), r"dp must be an integer >= 1.*got 2\.5"),
    (lambda: zero_memory(PSI, 8, 4), r"stage must be 0 \(DDP\), 1 .* or 3 .*got 4.*strategy_memory"),
    (lambda: zero_memory(PSI, 8, True), r"stage must be 0"),
    (lambda: zero_memory(PSI, 8, 3, k=-12), r"k must be >= 0"),
    (lambda: max_num_params(0, 8, 3), r"memory_bytes must be > 0, e\.g\. 32 \* GB"),
    (lambda: strategy_memory(PSI, 8, "zero4"), r"unknown strategy 'zero4'; pass one of \["),
    (lambda: strategy_memory(PSI, 8, "hybrid_shard"), r"hybrid_shard needs group_size="),
    (lambda: strategy_memory(PSI, 12, "hybrid_shard", group_size=8),
     r"group_size=8 must divide world_size=12"),
    (lambda: comm_volume("ddp", PSI, 8, group_size=4), r"group_size applies only to 'hybrid_shard'"),
    (lambda: comm_breakdown("ddp", PSI, 8, kind="bytes"), r"kind must be 'payload', 'logical' or 'wire'"),
    (lambda: ring_wire_bytes("broadcast", 10, 4), r"ring wire bytes are defined for"),
    (lambda: ring_all_reduce_time(1e6, 0, 1e-5, 1e-9), r"world_size must be an integer >= 1"),
    (lambda: fit_alpha_beta([1e3, 1e3], [1.0, 1.1]), r"at least two different sizes"),
    (lambda: fit_alpha_beta([1e3, 1e6], [1.0]), r"same length"),
    (lambda: fit_alpha_beta([1e3, 1e6], [1e-5, 0.0]), r"times_s must all be > 0 seconds"),
    (lambda: fit_alpha_beta([1e3, 1e6], [1.0, 2.0], world_size=1, op="all_reduce"),
     r"moves no data"),
    (lambda: fsdp_paper_cross_host_elements("zero1", PSI, 16, 8), r"only for \["),
    (lambda: optimizer_k("lion"), r"unknown optimizer 'lion'.*give k="),
])
def test_invalid_input_messages(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_theory_exports_the_comm_formulas():
    public = {name for name in vars(theory_comm) if not name.startswith("_")}
    public -= {"Integral", "Real", "NamedTuple", "np"}  # imports, not API
    assert public <= set(theory.__all__)
    assert all(hasattr(theory, name) for name in theory.__all__)
