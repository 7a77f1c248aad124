"""Lab 05's public checks: realistic wrong answers fail with a useful message.

The solution passes every check: tests/test_labs.py runs the solution notebook and asserts each check() result
(this file ran the same checks on the solution's namespace to assert the same).
"""
import contextlib
import sys

import cloudpickle
import pytest
import torch.distributed as dist

from helpers.grading.check import run_one
from helpers.grading.checks.lab05 import common as lab05
from helpers.grading.prepare.labgen import ROOT
from helpers.grading.registry import checks_for
from helpers.theory import collective_time, ring_all_reduce_time
from tests.lab_solution import namespace as run_solution

SOLUTION = ROOT / "solutions" / "05_accumulation_and_scaling.ipynb"

# The wrong answers below travel to the ranks by value. By reference, every rank would first import this module,
# and with it nbformat and pytest: measured 43 s instead of 3 s for a test of two launches on a busy machine.
cloudpickle.register_pickle_by_value(sys.modules[__name__])


@pytest.fixture(scope="module")
def solution():
    """The solution's parameters, imports and answers, every cell but the check() calls."""
    return run_solution(SOLUTION, lambda cell: "check(" not in cell.source)


def outcome(question, check_name, namespace):
    """(status, reason) of one named public check."""
    return run_one(dict(checks_for(question))[check_name], namespace)


def with_answer(solution, **answers):
    """The solution's namespace with some answers replaced by wrong ones."""
    return {**solution, **answers}


# ------------------------------------------------------------------------------------------------ the solution
@pytest.mark.timeout(120)
def test_last_check_follows_the_notebook_parameters(solution):
    namespace = with_answer(solution, WORLD_SIZE=2, GLOBAL_BATCH=14, MICRO_BATCH_SIZE=5, STEPS=2)
    assert outcome("5.3", "different_data_identical_parameters", namespace) == ("passed", "")


# ------------------------------------------------------------------------------------------------ 5.1 wrong answers
def accumulate(micro_step, weighting="size", zero_grad=True, result="mean"):
    """An accumulate_and_step whose micro-batch handling is micro_step(model, x, y, scale, last) -> loss tensor."""

    def accumulate_and_step(model, optimizer, micro_batches, loss_fn):
        if zero_grad:
            optimizer.zero_grad()
        total, mean = sum(len(y) for _, y in micro_batches), 0.0
        for i, (x, y) in enumerate(micro_batches):
            scale = {"size": len(y) / total, "count": 1 / len(micro_batches), "none": 1.0}[weighting]
            loss = micro_step(model, loss_fn, x, y, scale, i == len(micro_batches) - 1)
            mean += loss.item() * len(y) / total
        optimizer.step()
        return mean if result == "mean" else loss.item()

    return accumulate_and_step


def right(model, loss_fn, x, y, scale, last):
    with contextlib.nullcontext() if last else model.no_sync():
        loss = loss_fn(model(x), y)
        (loss * scale).backward()
    return loss


def no_no_sync(model, loss_fn, x, y, scale, last):
    loss = loss_fn(model(x), y)
    (loss * scale).backward()
    return loss


def backward_only(model, loss_fn, x, y, scale, last):
    loss = loss_fn(model(x), y)  # forward outside no_sync: DDP has armed its hooks
    with contextlib.nullcontext() if last else model.no_sync():
        (loss * scale).backward()
    return loss


def everything_in_no_sync(model, loss_fn, x, y, scale, last):
    with model.no_sync():
        loss = loss_fn(model(x), y)
        (loss * scale).backward()
    return loss


def test_reference_wrong_answer_is_the_solution(solution):
    # The helper above, with `right`, must behave as the solution: otherwise the tests below prove nothing.
    namespace = with_answer(solution, accumulate_and_step=accumulate(right))
    assert outcome("5.1", "same_steps_as_one_process_on_the_whole_batch", namespace) == ("passed", "")


@pytest.mark.timeout(120)
@pytest.mark.parametrize("micro_step", [no_no_sync, backward_only], ids=["no no_sync", "backward-only no_sync"])
def test_syncing_every_micro_batch_fails_the_count(solution, micro_step, monkeypatch):
    monkeypatch.setattr(lab05, "HANG_TIMEOUT", 3.0)
    namespace = with_answer(solution, accumulate_and_step=accumulate(micro_step))
    status, reason = outcome("5.1", "one_bucket_set_per_optimizer_step", namespace)
    assert status == "failed" and "all-reduced at every micro-batch" in reason and "forward AND the backward" in reason
    # With as many micro-batches on every rank the gradient is still right: only the count catches it. With 3, 2 and
    # 1 micro-batches, the ranks issue different numbers of all-reduces and wait for each other.
    status, reason = outcome("5.1", "same_steps_as_one_process_on_the_whole_batch", namespace)
    assert status == "failed" and "the ranks hung" in reason and "exactly one synchronised backward" in reason


@pytest.mark.timeout(120)
def test_last_micro_batch_inside_no_sync_fails(solution):
    namespace = with_answer(solution, accumulate_and_step=accumulate(everything_in_no_sync))
    status, reason = outcome("5.1", "one_bucket_set_per_optimizer_step", namespace)
    assert status == "failed" and "no all-reduce at all" in reason
    status, reason = outcome("5.1", "same_steps_as_one_process_on_the_whole_batch", namespace)
    assert status == "failed" and "differ from rank 0's" in reason


@pytest.mark.timeout(120)
@pytest.mark.parametrize("weighting, message", [("count", "divided by the number of micro-batches"),
                                                ("none", "were not scaled")])
def test_wrong_loss_weighting_fails_with_a_hint(solution, weighting, message):
    namespace = with_answer(solution, accumulate_and_step=accumulate(right, weighting=weighting))
    assert outcome("5.1", "one_bucket_set_per_optimizer_step", namespace) == ("passed", "")
    status, reason = outcome("5.1", "same_steps_as_one_process_on_the_whole_batch", namespace)
    assert status == "failed" and message in reason and "identical on every rank" in reason


@pytest.mark.timeout(120)
def test_missing_zero_grad_fails_with_a_hint(solution):
    namespace = with_answer(solution, accumulate_and_step=accumulate(right, zero_grad=False))
    status, reason = outcome("5.1", "same_steps_as_one_process_on_the_whole_batch", namespace)
    assert status == "failed" and "optimizer.zero_grad()" in reason


@pytest.mark.timeout(120)
def test_wrong_returned_loss_fails(solution):
    namespace = with_answer(solution, accumulate_and_step=accumulate(right, result="last"))
    status, reason = outcome("5.1", "same_steps_as_one_process_on_the_whole_batch", namespace)
    assert status == "failed" and "mean loss over its samples" in reason


@pytest.mark.timeout(120)
def test_unimplemented_answer_on_ranks_is_not_implemented(solution):
    def todo(model, optimizer, micro_batches, loss_fn):
        raise NotImplementedError("lab 5.1")

    namespace = with_answer(solution, accumulate_and_step=todo)
    assert outcome("5.1", "one_bucket_set_per_optimizer_step", namespace)[0] == "not implemented"
    assert outcome("5.3", "different_data_identical_parameters", namespace)[0] == "not implemented"


# ------------------------------------------------------------------------------------------------ 5.2 wrong answers
def predictor(buckets="ddp", op="all_reduce", overlap_rule="right"):
    """A predict_step_time with one of the usual mistakes."""

    def predict_step_time(num_params, world_size, compute_s, link, *, bytes_per_param=4,
                          bucket_cap_bytes=25 * 2**20, first_bucket_bytes=2**20, overlap=0.0):
        total = num_params * bytes_per_param
        if buckets == "one":
            sizes = [total]
        else:
            first = first_bucket_bytes if buckets == "ddp" else bucket_cap_bytes
            sizes = [min(first, total)]
            while sum(sizes) < total:
                sizes.append(min(bucket_cap_bytes, total - sum(sizes)))
        comm = sum(collective_time(op, s, world_size, link.alpha_s, link.beta_s_per_byte) for s in sizes)
        if overlap_rule == "ignored":
            return compute_s + comm
        if overlap_rule == "max":
            return max(compute_s, comm)
        return compute_s + max(0.0, comm - overlap * compute_s)

    return predict_step_time


@pytest.mark.parametrize("wrong, message", [
    (predictor(buckets="equal"), "first bucket holds only first_bucket_bytes"),
    (predictor(buckets="one"), "cut the gradient bytes into buckets"),
    (predictor(op="unchunked_ring_all_reduce"), "unchunked ring"),
    (predictor(overlap_rule="ignored"), "step = compute_s + max(0, comm - overlap * compute_s)"),
    (predictor(overlap_rule="max"), "only a fraction `overlap`"),
], ids=["no first bucket", "one bucket", "unchunked ring", "overlap ignored", "full overlap"])
def test_wrong_step_time_fails_with_a_hint(solution, wrong, message):
    assert predictor()(1e8, 8, 0.2, solution["Link"]("l", 3e-6, 300e9)) == pytest.approx(
        solution["predict_step_time"](1e8, 8, 0.2, solution["Link"]("l", 3e-6, 300e9)), rel=1e-12)
    status, reason = outcome("5.2", "step_time_matches_the_ring_formula_per_bucket",
                             with_answer(solution, predict_step_time=wrong))
    assert status == "failed" and message in reason and "expected" in reason


def test_swapped_weak_and_strong_fails_with_a_hint(solution):
    def swapped(num_params, world_size, compute_s, link, *, weak=True, **options):
        return solution["scaling_efficiency"](num_params, world_size, compute_s, link, weak=not weak, **options)

    status, reason = outcome("5.2", "scaling_efficiency_weak_and_strong",
                             with_answer(solution, scaling_efficiency=swapped))
    assert status == "failed" and "other kind of scaling" in reason


def test_strong_scaling_without_the_factor_n_fails(solution):
    def no_factor(num_params, world_size, compute_s, link, *, weak=True, **options):
        per_gpu = compute_s if weak else compute_s / world_size
        return compute_s / solution["predict_step_time"](num_params, world_size, per_gpu, link, **options)

    status, reason = outcome("5.2", "scaling_efficiency_weak_and_strong",
                             with_answer(solution, scaling_efficiency=no_factor))
    assert status == "failed" and "weak=False" in reason


def test_solution_step_time_uses_the_ring_formula(solution):
    link = solution["Link"]("l", 1e-5, 1e10)
    expected = 0.1 + sum(ring_all_reduce_time(b, 4, 1e-5, 1e-10) for b in (2**20, 25 * 2**20, 4 * 2**20))
    assert solution["predict_step_time"]((30 * 2**20) / 4, 4, 0.1, link) == pytest.approx(expected, rel=1e-12)


# ------------------------------------------------------------------------------------------------ 5.3 wrong answers
def strided(x, y, micro_batch_size):
    rank, world_size = dist.get_rank(), dist.get_world_size()
    if len(x) % world_size:
        raise ValueError("uneven")
    return list(zip(x[rank::world_size].split(micro_batch_size), y[rank::world_size].split(micro_batch_size)))


def no_check(x, y, micro_batch_size):
    rank, world_size = dist.get_rank(), dist.get_world_size()
    per_rank = -(-len(x) // world_size)
    shard = slice(rank * per_rank, (rank + 1) * per_rank)
    return list(zip(x[shard].split(micro_batch_size), y[shard].split(micro_batch_size)))


def same_data_everywhere(x, y, micro_batch_size):
    per_rank = len(x) // dist.get_world_size()
    return list(zip(x[:per_rank].split(micro_batch_size), y[:per_rank].split(micro_batch_size)))


@pytest.mark.timeout(120)
def test_strided_shards_fail(solution):
    status, reason = outcome("5.3", "shards_and_micro_batches", with_answer(solution, micro_batches_of_rank=strided))
    assert status == "failed" and "rank r keeps rows" in reason


@pytest.mark.timeout(120)
def test_missing_value_error_fails(solution):
    namespace = with_answer(solution, micro_batches_of_rank=no_check)
    assert outcome("5.3", "shards_and_micro_batches", namespace) == ("passed", "")
    status, reason = outcome("5.3", "uneven_global_batch_raises_value_error", namespace)
    assert status == "failed" and "expected ValueError on every rank" in reason


@pytest.mark.timeout(120)
def test_same_data_on_every_rank_fails_the_last_check(solution):
    status, reason = outcome("5.3", "different_data_identical_parameters",
                             with_answer(solution, micro_batches_of_rank=same_data_everywhere))
    assert status == "failed" and "trained on the same data" in reason


@pytest.mark.timeout(120)
def test_last_check_catches_a_wrong_accumulation(solution):
    namespace = with_answer(solution, accumulate_and_step=accumulate(right, weighting="count"))
    status, reason = outcome("5.3", "different_data_identical_parameters", namespace)
    assert status == "failed" and "one process on the whole batch" in reason
    namespace = with_answer(solution, accumulate_and_step=accumulate(everything_in_no_sync))
    status, reason = outcome("5.3", "different_data_identical_parameters", namespace)
    assert status == "failed" and "drifted apart" in reason


@pytest.mark.timeout(120)
def test_unimplemented_split_is_not_implemented(solution):
    def todo(x, y, micro_batch_size):
        raise NotImplementedError("lab 5.3")

    assert outcome("5.3", "shards_and_micro_batches", with_answer(solution, micro_batches_of_rank=todo))[0] == \
        "not implemented"
