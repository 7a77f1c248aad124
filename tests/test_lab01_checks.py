"""Lab 01's public checks: realistic wrong answers fail with a useful message.

The solution passes every check: tests/test_labs.py runs the solution notebook and asserts each check() result
(this file ran the same checks on the solution's definitions to assert the same).
"""
import sys

import cloudpickle
import pytest
import torch
import torch.distributed as dist

from helpers.grading.check import run_one
from helpers.grading.checks.lab01 import common as lab01
from helpers.grading.prepare.labgen import ROOT
from helpers.grading.registry import checks_for
from tests.lab_solution import namespace as run_solution

SOLUTION = ROOT / "solutions" / "01_gradient_averaging.ipynb"
# The wrong answers below travel to the ranks by value, like a notebook's functions; by reference, every rank
# would import this module (and nbformat), seconds per launch on 2 cores.
cloudpickle.register_pickle_by_value(sys.modules[__name__])


@pytest.fixture(scope="module")
def solution():
    """The solution's parameters, imports and answers, every cell but the check() calls."""
    return run_solution(SOLUTION, lambda cell: "check(" not in cell.source)


def outcome(question, check_name, namespace):
    """(status, reason) of one named public check."""
    fn = dict(checks_for(question))[check_name]
    return run_one(fn, namespace)


def with_answer(solution, **answers):
    """The solution's namespace with some answers replaced by wrong ones."""
    return {**solution, **answers}


# ------------------------------------------------------------------------------------------------ the solution
@pytest.mark.timeout(120)
def test_last_check_follows_the_notebook_parameters(solution):
    namespace = with_answer(solution, SHARD_SIZES=[1, 9, 3, 6], STEPS=2)
    assert outcome("1.3", "training_ends_identical_and_equal_to_one_process", namespace) == ("passed", "")


# ------------------------------------------------------------------------------------------------ 1.1 wrong answers
def plain_mean(grads, counts):
    if isinstance(grads[0], torch.Tensor):
        return torch.stack(grads).mean(0)
    return [torch.stack(parts).mean(0) for parts in zip(*grads)]


def weights_in_place(grads, counts):
    total = sum(counts)
    kept = [g.mul_(n / total) for g, n in zip(grads, counts) if n and isinstance(g, torch.Tensor)]
    return sum(kept)


def keeps_empty_shards(grads, counts):
    total = sum(counts)
    if len(grads) != len(counts) or total == 0:
        raise ValueError("bad input")
    if isinstance(grads[0], torch.Tensor):
        return sum(g * (n / total) for g, n in zip(grads, counts))
    return [sum(g[i] * (n / total) for g, n in zip(grads, counts)) for i in range(len(grads[0]))]


def test_plain_mean_fails_with_a_hint(solution):
    namespace = with_answer(solution, weighted_mean_grads=plain_mean)
    status, reason = outcome("1.1", "flat_gradients_of_unequal_shards", namespace)
    assert status == "failed" and "That is the plain mean" in reason and "shards of [5, 7, 2]" in reason


def test_modifying_the_inputs_fails(solution):
    status, reason = outcome("1.1", "flat_gradients_of_unequal_shards",
                             with_answer(solution, weighted_mean_grads=weights_in_place))
    assert status == "failed" and "modified the gradients it was given" in reason


def test_nan_from_an_empty_shard_fails(solution):
    namespace = with_answer(solution, weighted_mean_grads=keeps_empty_shards)
    assert outcome("1.1", "flat_gradients_of_unequal_shards", namespace) == ("passed", "")
    status, reason = outcome("1.1", "empty_shard_is_ignored", namespace)
    assert status == "failed" and "made the result NaN" in reason


def test_missing_value_error_fails(solution):
    namespace = with_answer(solution, weighted_mean_grads=plain_mean)
    status, reason = outcome("1.1", "bad_input_raises_value_error", namespace)
    assert status == "failed" and "expected ValueError" in reason


# ------------------------------------------------------------------------------------------------ 1.2 wrong answers
def per_rank_token_mean(token_losses, mask):
    mask = mask.float()
    return (token_losses * mask).sum() / mask.sum()


def forgets_world_size(token_losses, mask):
    mask = mask.float()
    total = mask.sum().detach()
    dist.all_reduce(total)
    return (token_losses * mask).sum() / total


@pytest.mark.timeout(120)
def test_per_rank_token_mean_fails(solution):
    namespace = with_answer(solution, global_token_mean_loss=per_rank_token_mean)
    status, reason = outcome("1.2", "three_ranks_unequal_tokens", namespace)
    assert status == "failed" and "the average of per-rank token means" in reason
    status, reason = outcome("1.2", "a_rank_without_tokens_and_bool_mask", namespace)
    assert status == "failed" and "NaN or inf" in reason


@pytest.mark.timeout(120)
def test_missing_world_size_factor_fails(solution):
    status, reason = outcome("1.2", "two_ranks", with_answer(solution, global_token_mean_loss=forgets_world_size))
    assert status == "failed" and "multiply this rank's share of the loss by it" in reason


# ------------------------------------------------------------------------------------------------ 1.3 wrong answers
def plain_average(model, num_samples):
    for p in model.parameters():
        if p.grad is None:
            p.grad = torch.zeros_like(p)
        dist.all_reduce(p.grad)
        p.grad /= dist.get_world_size()


def averages_parameters(model, num_samples):
    # The picotron bug: parameters averaged, gradients left local.
    for p in model.parameters():
        if p.grad is None:
            p.grad = torch.zeros_like(p)
        with torch.no_grad():
            dist.all_reduce(p)
            p /= dist.get_world_size()


def skips_missing_grads(model, num_samples):
    total = torch.tensor([float(num_samples)])
    dist.all_reduce(total)
    for p in model.parameters():
        if p.grad is not None:  # a rank without data skips every all-reduce: the others wait forever
            p.grad.mul_(num_samples / total.item())
            dist.all_reduce(p.grad)


@pytest.mark.timeout(120)
def test_plain_average_over_ranks_fails(solution):
    status, reason = outcome("1.3", "full_batch_gradient_on_three_unequal_ranks",
                             with_answer(solution, average_gradients=plain_average))
    assert status == "failed" and "That is the plain mean over ranks" in reason


@pytest.mark.timeout(120)
def test_averaging_parameters_instead_of_gradients_fails(solution):
    namespace = with_answer(solution, average_gradients=averages_parameters)
    status, reason = outcome("1.3", "full_batch_gradient_on_three_unequal_ranks", namespace)
    assert status == "failed" and "average_gradients changed the parameters" in reason
    status, reason = outcome("1.3", "training_ends_identical_and_equal_to_one_process", namespace)
    assert status == "failed" and "drifted apart" in reason


@pytest.mark.timeout(120)
def test_skipping_a_collective_is_reported_as_a_hang(solution, monkeypatch):
    monkeypatch.setattr(lab01, "HANG_TIMEOUT", 3.0)
    namespace = with_answer(solution, average_gradients=skips_missing_grads)
    assert outcome("1.3", "full_batch_gradient_on_three_unequal_ranks", namespace) == ("passed", "")
    status, reason = outcome("1.3", "rank_with_no_samples", namespace)
    assert status == "failed" and "did not finish together: some rank skipped" in reason and "rank 1" in reason


@pytest.mark.timeout(120)
def test_unimplemented_answer_on_ranks_is_not_implemented(solution):
    def todo(model, num_samples):
        raise NotImplementedError("lab 1.3")

    assert outcome("1.3", "rank_with_no_samples", with_answer(solution, average_gradients=todo))[0] == "not implemented"
