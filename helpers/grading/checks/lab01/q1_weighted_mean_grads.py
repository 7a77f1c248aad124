"""Checks of lab 1.1: weighted_mean_grads, the mean of per-shard gradients weighted by shard size."""
import torch

from helpers.grading.checks.lab01.common import (
    SHARDS,
    TOL,
    flat,
    full_batch_grads,
    make_model,
    max_diff,
    mean_loss_grads,
    shards_of,
)
from helpers.grading.registry import answer, public_check


# ------------------------------------------------------------------------------------------------ question 1.1
def _shard_grads(sizes, nan_on_empty, offset):
    """Per-shard gradients (per parameter) of a mean loss; NaN (or zeros) for a shard without samples."""
    model, grads = make_model(offset), []
    for x, y in shards_of(sizes, seed=11 + offset):
        if len(x):
            grads.append(mean_loss_grads(model, x, y))
        else:  # the mean over no samples: NaN, as F.cross_entropy gives
            grads.append([torch.full_like(p, float("nan") if nan_on_empty else 0.0) for p in model.parameters()])
    return grads


def weighted_run(fn, as_lists, sizes=SHARDS, nan_on_empty=False, offset=0):
    """{"result": the answer on per-shard gradients (flat or per parameter), "unchanged": its inputs left alone}."""
    grads = _shard_grads(sizes, nan_on_empty, offset)
    inputs = grads if as_lists else [flat(g) for g in grads]
    copies = [[t.clone() for t in g] if as_lists else g.clone() for g in inputs]
    result = fn(inputs, list(sizes))
    as_flat = flat if as_lists else (lambda t: t)
    # NaN != NaN: only inputs without NaN are compared
    unchanged = nan_on_empty or all(torch.equal(as_flat(a), as_flat(b)) for a, b in zip(inputs, copies))
    return {"result": result, "unchanged": unchanged}


def _weighted_case(run, sizes=SHARDS, offset=0):
    """(answer, expected, plain mean) of a weighted_run."""
    assert run["unchanged"], "weighted_mean_grads modified the gradients it was given: build new tensors instead"
    expected = full_batch_grads([s for s in shards_of(sizes, seed=11 + offset) if len(s[0])], offset)
    plain = torch.stack([flat(g) for g, n in zip(_shard_grads(sizes, False, offset), sizes) if n]).mean(0)
    return run["result"], flat(expected), plain


def check_flat(run, offset=0):
    """flat_gradients_of_unequal_shards' assertions on a weighted_run (the grader's hidden test runs them too)."""
    result, expected, plain = _weighted_case(run, SHARDS, offset)
    assert isinstance(result, torch.Tensor) and result.shape == expected.shape, (
        f"for flat gradient tensors, expected one tensor of shape {tuple(expected.shape)}, got "
        f"{type(result).__name__} {tuple(getattr(result, 'shape', ()))}")
    error = max_diff(result, expected)
    hint = ""
    if max_diff(result, plain) <= TOL:
        hint = " That is the plain mean: weight shard r by counts[r] / sum(counts)."
    elif max_diff(result, sum(SHARDS) * expected) <= TOL * sum(SHARDS):
        hint = (" That is sum(counts) times the answer: weight shard r by counts[r] / sum(counts), "
                "not counts[r] (divide).")
    assert error <= TOL, (f"shards of {list(SHARDS)} samples: max |answer - full-batch gradient| = {error:.2e} "
                          f"(tolerance {TOL:.0e}).{hint}")


def check_lists(run, offset=0):
    result, expected, _ = _weighted_case(run, SHARDS, offset)
    assert isinstance(result, (list, tuple)), (
        f"for lists of per-parameter gradients, expected a list of tensors, got {type(result).__name__}")
    shapes = [tuple(p.shape) for p in make_model().parameters()]
    assert [tuple(t.shape) for t in result] == shapes, (
        f"expected one tensor per parameter with shapes {shapes}, got {[tuple(t.shape) for t in result]}")
    error = max_diff(flat(result), expected)
    assert error <= TOL, f"per-parameter lists: max |answer - full-batch gradient| = {error:.2e} (tolerance {TOL:.0e})"


def check_empty(run, offset=0):
    result, expected, _ = _weighted_case(run, (4, 0, 6), offset)
    assert torch.isfinite(result).all(), (
        "a shard with count 0 (gradient NaN: the mean over no samples) made the result NaN: skip such shards")
    error = max_diff(result, expected)
    assert error <= TOL, f"counts (4, 0, 6): max |answer - full-batch gradient| = {error:.2e} (tolerance {TOL:.0e})"


@public_check("1.1")
def flat_gradients_of_unequal_shards(ns):
    check_flat(weighted_run(answer(ns, "weighted_mean_grads"), as_lists=False))


@public_check("1.1")
def per_parameter_lists(ns):
    check_lists(weighted_run(answer(ns, "weighted_mean_grads"), as_lists=True))


@public_check("1.1")
def empty_shard_is_ignored(ns):
    check_empty(weighted_run(answer(ns, "weighted_mean_grads"), False, (4, 0, 6), nan_on_empty=True))


@public_check("1.1")
def bad_input_raises_value_error(ns):
    fn = answer(ns, "weighted_mean_grads")
    grads = [torch.ones(3), torch.ones(3)]
    for counts, why in (([1, 2, 3], "3 counts for 2 gradients"), ([0, 0], "no samples at all")):
        try:
            fn(grads, counts)
        except ValueError:
            continue
        except NotImplementedError:
            raise
        except Exception as exc:  # noqa: BLE001 - any other exception is the wrong one
            raise AssertionError(f"{why}: expected ValueError, got {type(exc).__name__}: {exc}") from None
        raise AssertionError(f"{why}: expected ValueError, but weighted_mean_grads returned")
