"""Checks of lab 1.3: average_gradients over unequal shards, and training that matches one process."""
import torch
import torch.distributed as dist
import torch.nn.functional as F

from helpers.grading.checks.lab01.common import (
    SHARDS,
    TOL,
    flat,
    flat_grad,
    full_batch_grads,
    make_model,
    max_diff,
    mean_loss_grads,
    run_on_ranks,
    shards_of,
)
from helpers.grading.registry import answer, public_check


# ------------------------------------------------------------------------------------------------ question 1.3
def gradient_rank(fn, sizes, offset=0):
    """On each rank: mean loss on this rank's shard (no backward if it has no samples), then the answer."""
    rank = dist.get_rank()
    x, y = shards_of(sizes, seed=7 + offset)[rank]
    model = make_model(offset)
    if len(x):
        F.cross_entropy(model(x), y).backward()
    before = [p.detach().clone() for p in model.parameters()]
    fn(model, len(x))
    if any(not torch.equal(b, p.detach()) for b, p in zip(before, model.parameters())):
        raise AssertionError("average_gradients changed the parameters: average the gradients (p.grad), never the "
                             "parameters (the picotron hook bug)")
    # Returned, not asserted here: a rank that skipped the all-reduces must not end the run before the hang shows.
    return flat_grad(model), [name for name, p in model.named_parameters() if p.grad is None]


def check_gradients(ns, sizes):
    fn = answer(ns, "average_gradients")
    check_gradient_results(run_on_ranks(gradient_rank, len(sizes), args=(fn, sizes)), sizes)


def check_gradient_results(results, sizes, offset=0):
    """The assertions on gradient_rank's results (the grader's hidden test runs them too)."""
    shards = shards_of(sizes, seed=7 + offset)
    expected = flat(full_batch_grads([s for s in shards if len(s[0])], offset))
    where = f"{len(sizes)} ranks with {list(sizes)} samples"
    for rank, (_, missing) in enumerate(results):
        assert not missing, f"{where}: after average_gradients, p.grad is None on rank {rank} for {missing}"
    results = [g for g, _ in results]
    for rank, g in enumerate(results):
        assert torch.equal(g, results[0]), (
            f"{where}: rank {rank}'s gradient differs from rank 0's by {max_diff(g, results[0]):.2e}; after "
            "average_gradients every rank must hold the same gradient (the result of the same all-reduces)")
    error = max_diff(results[0], expected)
    plain = torch.stack([flat(mean_loss_grads(make_model(offset), x, y)) for x, y in shards if len(x)]).mean(0)
    hint = (" That is the plain mean over ranks: weight rank r by num_samples / (total samples)."
            if max_diff(results[0], plain) <= TOL else "")
    assert error <= TOL, f"{where}: max |gradient - one-process full-batch gradient| = {error:.2e} " \
                         f"(tolerance {TOL:.0e}).{hint}"


@public_check("1.3")
def full_batch_gradient_on_three_unequal_ranks(ns):
    check_gradients(ns, SHARDS)


@public_check("1.3")
def rank_with_no_samples(ns):
    check_gradients(ns, (6, 0, 3))


def train_rank(fn, sizes, steps, lr, seed):
    """On each rank: `steps` SGD steps on fresh, unequal data, syncing with the answer; the final parameters."""
    rank = dist.get_rank()
    model = make_model(seed)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    for step in range(steps):
        x, y = shards_of(sizes, seed=seed + 100 * (step + 1))[rank]
        optimizer.zero_grad(set_to_none=True)  # a rank without samples then has p.grad None
        if len(x):
            F.cross_entropy(model(x), y).backward()
        fn(model, len(x))
        optimizer.step()
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def train_reference(sizes, steps, lr, seed):
    """One process, the whole batch (all ranks' shards) at every step."""
    model = make_model(seed)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    for step in range(steps):
        shards = shards_of(sizes, seed=seed + 100 * (step + 1))
        optimizer.zero_grad()
        F.cross_entropy(model(torch.cat([s[0] for s in shards])), torch.cat([s[1] for s in shards])).backward()
        optimizer.step()
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


@public_check("1.3")
def training_ends_identical_and_equal_to_one_process(ns):
    fn = answer(ns, "average_gradients")
    sizes, steps = list(ns.get("SHARD_SIZES", SHARDS)), int(ns.get("STEPS", 3))
    lr, seed, tol = float(ns.get("LR", 0.5)), int(ns.get("SEED", 0)), float(ns.get("TOL", TOL))
    assert len(sizes) >= 2 and sum(sizes) > 0 and steps >= 1, (
        f"SHARD_SIZES={sizes}, STEPS={steps}: need at least 2 ranks, some samples and one step")
    params = run_on_ranks(train_rank, len(sizes), args=(fn, sizes, steps, lr, seed))
    where = f"{len(sizes)} ranks with {sizes} samples, {steps} SGD steps (lr {lr})"
    for rank, p in enumerate(params):
        assert torch.equal(p, params[0]), (
            f"{where}: rank {rank}'s parameters differ from rank 0's by {max_diff(p, params[0]):.2e}: the ranks "
            "drifted apart. Every rank must step with the same (all-reduced) gradient")
    start = torch.cat([p.detach().reshape(-1) for p in make_model(seed).parameters()])
    assert max_diff(params[0], start) > 0, f"{where}: the parameters never changed: is p.grad left at zero?"
    error = max_diff(params[0], train_reference(sizes, steps, lr, seed))
    assert error <= tol, (f"{where}: identical on every rank, but max |parameters - one-process training| = "
                          f"{error:.2e} (tolerance {tol:.0e})")
