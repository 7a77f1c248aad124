"""Checks of lab 5.2: predict_step_time and scaling_efficiency against values recorded for fixed inputs."""
import math

from helpers.grading.registry import answer, public_check
from helpers.simulate import Link

REL_TOL = 1e-9  # predictions: the same formula summed in another order
MiB = 2**20


# ------------------------------------------------------------------------------------------------ question 5.2
A100ISH = Link("instructor: 300 GB/s, 3 us", 3e-6, 300e9)
IB = Link("instructor: 25 GB/s, 10 us", 10e-6, 25e9)
SLOW = Link("instructor: 1 GB/s, 300 us", 300e-6, 1e9)
MEDIUM = Link("instructor: 10 GB/s, 10 us", 10e-6, 10e9)

# (num_params, world_size, compute_s, link, keyword arguments)
STEP_CASES = [
    (1e8, 8, 0.2, A100ISH, dict(bytes_per_param=2)),
    (1e8, 8, 0.2, A100ISH, dict(bytes_per_param=2, overlap=2 / 3)),
    (1.5e9, 64, 0.5, IB, dict(bytes_per_param=2, overlap=2 / 3)),
    (5e4, 3, 1e-3, SLOW, dict()),  # 200 KB: less than the first bucket
    ((MiB + 2 * 25 * MiB) / 4, 4, 0.01, MEDIUM, dict(overlap=0.5)),  # exactly 1 MiB + 2 x 25 MiB
    (3e7, 16, 0.05, MEDIUM, dict(bucket_cap_bytes=4 * MiB, first_bucket_bytes=4 * MiB, overlap=1.0)),
]


# Seconds per step for each of STEP_CASES, recorded (ring_all_reduce_time summed over DDP's buckets, worked out
# once): the right prediction, then what each mistake of STEP_HINTS predicts, in STEP_HINTS' order.
STEP_RECORDED = [
    # right, no first bucket, one bucket, unchunked ring, overlap ignored, full overlap
    (0.20154466666666668, 0.2015026666666667, 0.20120866666666667, 0.20485566666666669, 0.20154466666666668, 0.2),
    (0.2, 0.2, 0.2, 0.2, 0.20154466666666668, 0.2),
    (0.5490766666666678, 0.5478166666666677, 0.5, 7.7997466666666835, 0.882410000000001, 0.5),
    (0.0024666666666666665, 0.0024666666666666665, 0.0024666666666666665, 0.002, 0.0024666666666666665,
     0.0014666666666666665),
    (0.013201606400000003, 0.013201606400000003, 0.013081606400000001, 0.021133212800000002, 0.0182016064, 0.01),
    (0.05, 0.05, 0.05, 0.18435000000000007, 0.08119999999999998, 0.05),
]


STEP_HINTS = {
    "no first bucket": "DDP's first bucket holds only first_bucket_bytes (1 MiB); buckets of bucket_cap_bytes come "
                       "after it",
    "one bucket": "every bucket is its own all-reduce and pays the latency 2(N-1) alpha again: cut the gradient bytes "
                  "into buckets",
    "unchunked ring": "that is the unchunked ring, (N-1)(alpha + S beta): use helpers.theory.ring_all_reduce_time, "
                      "2(N-1) alpha + 2(N-1)/N S beta",
    "overlap ignored": "communication can hide under overlap * compute_s: step = compute_s + max(0, comm - overlap * "
                       "compute_s)",
    "full overlap": "max(compute, comm) assumes communication can hide under all of the compute; only a fraction "
                    "`overlap` of it",
}


def describe(case):
    num_params, world_size, compute_s, link, kwargs = case
    extra = "".join(f", {k}={v!r}" if isinstance(v, bool) else f", {k}={v:.4g}" for k, v in kwargs.items())
    return f"predict_step_time({num_params:.4g}, {world_size}, {compute_s}, <{link.name}>{extra})"


@public_check("5.2")
def step_time_matches_the_ring_formula_per_bucket(ns):
    fn = answer(ns, "predict_step_time")
    for case, (want, *mistakes) in zip(STEP_CASES, STEP_RECORDED):
        num_params, world_size, compute_s, link, kwargs = case
        got = fn(num_params, world_size, compute_s, link, **kwargs)
        if isinstance(got, (int, float)) and math.isclose(got, want, rel_tol=REL_TOL):
            continue
        hint = next((text for text, value in zip(STEP_HINTS.values(), mistakes) if isinstance(got, (int, float))
                     and math.isclose(got, value, rel_tol=REL_TOL)), "")
        raise AssertionError(f"{describe(case)} returned {got!r}, expected {want:.6g} s. {hint}".rstrip())


@public_check("5.2")
def one_gpu_has_no_communication(ns):
    fn = answer(ns, "predict_step_time")
    got = fn(1e9, 1, 0.3, SLOW, bytes_per_param=2)
    assert isinstance(got, (int, float)) and math.isclose(got, 0.3, rel_tol=REL_TOL), (
        f"predict_step_time(1e9, 1, 0.3, ...) returned {got!r}: one GPU all-reduces with nobody, so its step is "
        "compute_s = 0.3 s")


EFFICIENCY_CASES = [
    (1.5e9, 64, 0.5, IB, dict(bytes_per_param=2, overlap=2 / 3)),
    (1e8, 8, 0.2, A100ISH, dict(bytes_per_param=2)),
    (2.5e7, 3, 0.05, MEDIUM, dict(overlap=0.5)),
]
# Efficiency for each of EFFICIENCY_CASES, recorded: (weak, strong).
EFFICIENCY_RECORDED = [(0.9106196463153275, 0.020291461136711365), (0.9923358593793932, 0.9418087751462944),
                       (1.0, 0.7621951219512196)]


@public_check("5.2")
def scaling_efficiency_weak_and_strong(ns):
    fn = answer(ns, "scaling_efficiency")
    for (num_params, world_size, compute_s, link, kwargs), (weak_e, strong_e) in zip(EFFICIENCY_CASES,
                                                                                      EFFICIENCY_RECORDED):
        for weak in (True, False):
            got = fn(num_params, world_size, compute_s, link, weak=weak, **kwargs)
            want, other = (weak_e, strong_e) if weak else (strong_e, weak_e)
            call = describe((num_params, world_size, compute_s, link, {**kwargs, "weak": weak}))
            call = call.replace("predict_step_time", "scaling_efficiency")
            ok = isinstance(got, (int, float)) and math.isclose(got, want, rel_tol=REL_TOL)
            swapped = isinstance(got, (int, float)) and math.isclose(got, other, rel_tol=REL_TOL)
            hint = (" That is the other kind of scaling: weak keeps compute_s per GPU, strong splits compute_s over "
                    "the N GPUs and divides by N." if swapped else "")
            assert ok, f"{call} returned {got!r}, expected {want:.6g}.{hint}"
    assert math.isclose(fn(1e9, 1, 0.3, SLOW), 1.0, rel_tol=REL_TOL), "on one GPU the efficiency is 1 by definition"
