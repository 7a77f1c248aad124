"""Public checks of lab 01: gradient averaging with unequal shards and a token-normalised loss.

Every multi-rank check runs the student's function on ranks through helpers.launch (Gloo, CPU tensors) at world
size 3 (and 2), with different and unequal data on every rank, and compares with one process on the whole batch.
Wrong answers are recognised where possible (plain mean, missing world-size factor, ...) to say what to fix.
"""
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from helpers.errors import CollectiveHang, RankFailed
from helpers.grading.registry import answer, public_check
from helpers.launch import launch

TOL = 1e-5  # float32: gradients of order 0.1 summed in different orders agree far better than this
HANG_TIMEOUT = 10.0  # seconds without progress before a check reports a hang
SHARDS = (5, 7, 2)  # samples per rank: unequal on purpose
D_IN, D_HIDDEN, N_CLASSES, VOCAB, D_EMBED = 4, 8, 3, 11, 6


# ---------------------------------------------------------------------------------------------- shared pieces
def make_model(seed=0):
    """A tiny classifier, identical on every rank for the same seed."""
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(D_IN, D_HIDDEN), nn.Tanh(), nn.Linear(D_HIDDEN, N_CLASSES))


def make_batch(n, seed):
    """n samples: x (n, D_IN), labels y (n,)."""
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(n, D_IN, generator=generator), torch.randint(0, N_CLASSES, (n,), generator=generator)


def shards_of(sizes, seed):
    """One batch per rank, with sizes[r] samples each, all different."""
    return [make_batch(n, seed * 1000 + rank) for rank, n in enumerate(sizes)]


def flat_grad(model):
    return torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1)
                      for p in model.parameters()])


def mean_loss_grads(model, x, y):
    """Per-parameter gradients of the mean cross-entropy on (x, y)."""
    model.zero_grad(set_to_none=True)
    F.cross_entropy(model(x), y).backward()
    return [p.grad.clone() for p in model.parameters()]


def full_batch_grads(shards, seed=0):
    """One process on the concatenation of all shards: the gradient every answer must reproduce."""
    x = torch.cat([s[0] for s in shards])
    y = torch.cat([s[1] for s in shards])
    return mean_loss_grads(make_model(seed), x, y)


def flat(tensors):
    return torch.cat([t.reshape(-1) for t in tensors])


def max_diff(a, b):
    return (a - b).abs().max().item()


def run_on_ranks(fn, world_size, args=()):
    """launch() for checks: Gloo, short hang timeout; a hang becomes a failure that says what to look for."""
    try:
        return launch(fn, world_size, args=args, backend="gloo", hang_timeout=HANG_TIMEOUT)
    except CollectiveHang as exc:
        raise AssertionError(
            f"the ranks hung (no progress for {HANG_TIMEOUT:.0f} s): some rank skipped or reordered a collective. "
            f"Every rank must call the same collectives in the same order, also a rank with no data or with "
            f"p.grad None. Launcher report:\n{exc}") from None
    except RankFailed as exc:
        if exc.exc_type == "NotImplementedError":
            raise
        raise AssertionError(f"a rank raised: {exc}") from None


# ------------------------------------------------------------------------------------------------ question 1.1
def _weighted_case(fn, as_lists, sizes=SHARDS, nan_on_empty=False):
    """(answer, expected, plain mean) for per-shard gradients of a mean loss, flat or per parameter."""
    shards = shards_of(sizes, seed=11)
    expected = full_batch_grads([s for s in shards if len(s[0])])
    model = make_model()
    grads = []
    for x, y in shards:
        if len(x):
            grads.append(mean_loss_grads(model, x, y))
        else:  # the mean over no samples: NaN, as F.cross_entropy gives
            grads.append([torch.full_like(p, float("nan") if nan_on_empty else 0.0) for p in model.parameters()])
    inputs = grads if as_lists else [flat(g) for g in grads]
    copies = [[t.clone() for t in g] if as_lists else g.clone() for g in inputs]
    result = fn(inputs, list(sizes))
    if not nan_on_empty:  # NaN != NaN: compare only inputs without NaN
        as_flat = flat if as_lists else (lambda t: t)
        unchanged = all(torch.equal(as_flat(a), as_flat(b)) for a, b in zip(inputs, copies))
        assert unchanged, "weighted_mean_grads modified the gradients it was given: build new tensors instead"
    plain = torch.stack([flat(g) for g, n in zip(grads, sizes) if n]).mean(0)
    return result, flat(expected), plain


@public_check("1.1")
def flat_gradients_of_unequal_shards(ns):
    fn = answer(ns, "weighted_mean_grads")
    result, expected, plain = _weighted_case(fn, as_lists=False)
    assert isinstance(result, torch.Tensor) and result.shape == expected.shape, (
        f"for flat gradient tensors, expected one tensor of shape {tuple(expected.shape)}, got "
        f"{type(result).__name__} {tuple(getattr(result, 'shape', ()))}")
    error = max_diff(result, expected)
    is_plain = max_diff(result, plain) <= TOL
    hint = " That is the plain mean: weight shard r by counts[r] / sum(counts)." if is_plain else ""
    assert error <= TOL, (f"shards of {list(SHARDS)} samples: max |answer - full-batch gradient| = {error:.2e} "
                          f"(tolerance {TOL:.0e}).{hint}")


@public_check("1.1")
def per_parameter_lists(ns):
    fn = answer(ns, "weighted_mean_grads")
    result, expected, _ = _weighted_case(fn, as_lists=True)
    assert isinstance(result, (list, tuple)), (
        f"for lists of per-parameter gradients, expected a list of tensors, got {type(result).__name__}")
    shapes = [tuple(p.shape) for p in make_model().parameters()]
    assert [tuple(t.shape) for t in result] == shapes, (
        f"expected one tensor per parameter with shapes {shapes}, got {[tuple(t.shape) for t in result]}")
    error = max_diff(flat(result), expected)
    assert error <= TOL, f"per-parameter lists: max |answer - full-batch gradient| = {error:.2e} (tolerance {TOL:.0e})"


@public_check("1.1")
def empty_shard_is_ignored(ns):
    fn = answer(ns, "weighted_mean_grads")
    result, expected, _ = _weighted_case(fn, as_lists=False, sizes=(4, 0, 6), nan_on_empty=True)
    assert torch.isfinite(result).all(), (
        "a shard with count 0 (gradient NaN: the mean over no samples) made the result NaN: skip such shards")
    error = max_diff(result, expected)
    assert error <= TOL, f"counts (4, 0, 6): max |answer - full-batch gradient| = {error:.2e} (tolerance {TOL:.0e})"


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


# ------------------------------------------------------------------------------------------------ question 1.2
def make_lm():
    torch.manual_seed(0)
    return nn.Sequential(nn.Embedding(VOCAB, D_EMBED), nn.Linear(D_EMBED, VOCAB))


def make_sequences(lengths, seed, width):
    """Token ids (len(lengths), width), padded with 0, and a float mask of real tokens."""
    generator = torch.Generator().manual_seed(seed)
    tokens, mask = torch.zeros(len(lengths), width, dtype=torch.long), torch.zeros(len(lengths), width)
    for row, n in enumerate(lengths):
        tokens[row, :n], mask[row, :n] = torch.randint(1, VOCAB, (n,), generator=generator), 1.0
    return tokens, mask


def lm_token_losses(model, tokens, mask):
    """Next-token losses (batch, len - 1) and the mask of positions with a real target."""
    logits = model(tokens[:, :-1])
    return F.cross_entropy(logits.transpose(1, 2), tokens[:, 1:], reduction="none"), mask[:, 1:]


def token_rank(fn, rank_lengths, bool_mask):
    """On each rank: the student's loss on this rank's sequences, backward, gradients averaged as DDP does."""
    rank, world_size = dist.get_rank(), dist.get_world_size()
    model = make_lm()
    width = max(max(lengths) for lengths in rank_lengths)  # every rank pads to the same length
    losses, mask = lm_token_losses(model, *make_sequences(rank_lengths[rank], seed=50 + rank, width=width))
    loss = fn(losses, mask.bool() if bool_mask else mask)
    assert isinstance(loss, torch.Tensor) and loss.dim() == 0, (
        f"global_token_mean_loss must return a scalar tensor, got {type(loss).__name__} "
        f"{tuple(getattr(loss, 'shape', ()))}")
    loss.backward()
    g = flat_grad(model)
    dist.all_reduce(g)
    return g / world_size, loss.detach()


def token_reference(rank_lengths):
    """One process: the token mean over all ranks' tokens; also the usual wrong answers, for hints."""
    model = make_lm()
    width = max(max(lengths) for lengths in rank_lengths)
    per_rank = [lm_token_losses(model, *make_sequences(lengths, seed=50 + r, width=width))
                for r, lengths in enumerate(rank_lengths)]
    total = sum(m.sum() for _, m in per_rank)
    loss = sum((l * m).sum() for l, m in per_rank) / total
    model.zero_grad()
    loss.backward(retain_graph=True)  # the wrong variants below reuse the graph
    right = flat_grad(model)
    wrong = {"the correct gradient divided by the world size: DDP divides the summed gradients by the world "
             "size, so multiply this rank's share of the loss by it": right / len(rank_lengths)}
    if all(m.sum() > 0 for _, m in per_rank):
        model.zero_grad()
        (sum((l * m).sum() / m.sum() for l, m in per_rank) / len(per_rank)).backward()
        wrong["the average of per-rank token means: tokens on ranks with few tokens weigh more; divide by the "
              "all-reduced token count instead"] = flat_grad(model)
    return loss.item(), right, wrong


def check_tokens(ns, rank_lengths, bool_mask):
    fn = answer(ns, "global_token_mean_loss")
    results = run_on_ranks(token_rank, len(rank_lengths), args=(fn, rank_lengths, bool_mask))
    value, expected, wrong = token_reference(rank_lengths)
    counts = [int(sum(max(n - 1, 0) for n in lengths)) for lengths in rank_lengths]
    g = results[0][0]
    where = f"{len(rank_lengths)} ranks with {counts} tokens to predict"
    assert torch.isfinite(g).all(), (
        f"{where}: the averaged gradient contains NaN or inf. A rank with no tokens must still give a finite "
        "loss (its token sum is 0): divide by the global count, not by the rank's own")
    error = max_diff(g, expected)
    hints = [name for name, w in wrong.items() if max_diff(g, w) <= TOL]
    hint = f" Your gradient is {hints[0]}." if hints else ""
    assert error <= TOL, (f"{where}: max |averaged gradient - one-process gradient| = {error:.2e} "
                          f"(tolerance {TOL:.0e}).{hint}")
    mean_value = sum(v for _, v in results).item() / len(results)
    assert abs(mean_value - value) <= TOL * 10, (
        f"{where}: the returned losses averaged over ranks = {mean_value:.6f}, expected the global token mean "
        f"{value:.6f}")


@public_check("1.2")
def three_ranks_unequal_tokens(ns):
    check_tokens(ns, [[9, 4], [2], [6, 6, 3]], bool_mask=False)


@public_check("1.2")
def a_rank_without_tokens_and_bool_mask(ns):
    check_tokens(ns, [[7, 5], [1, 1], [3, 8]], bool_mask=True)


@public_check("1.2")
def two_ranks(ns):
    check_tokens(ns, [[2, 3, 2], [11]], bool_mask=False)


# ------------------------------------------------------------------------------------------------ question 1.3
def gradient_rank(fn, sizes):
    """On each rank: mean loss on this rank's shard (no backward if it has no samples), then the answer."""
    rank = dist.get_rank()
    x, y = shards_of(sizes, seed=7)[rank]
    model = make_model()
    if len(x):
        F.cross_entropy(model(x), y).backward()
    fn(model, len(x))
    # Returned, not asserted here: a rank that skipped the all-reduces must not end the run before the hang shows.
    return flat_grad(model), [name for name, p in model.named_parameters() if p.grad is None]


def check_gradients(ns, sizes):
    fn = answer(ns, "average_gradients")
    results = run_on_ranks(gradient_rank, len(sizes), args=(fn, sizes))
    shards = shards_of(sizes, seed=7)
    expected = flat(full_batch_grads([s for s in shards if len(s[0])]))
    where = f"{len(sizes)} ranks with {list(sizes)} samples"
    for rank, (_, missing) in enumerate(results):
        assert not missing, f"{where}: after average_gradients, p.grad is None on rank {rank} for {missing}"
    results = [g for g, _ in results]
    for rank, g in enumerate(results):
        assert torch.equal(g, results[0]), (
            f"{where}: rank {rank}'s gradient differs from rank 0's by {max_diff(g, results[0]):.2e}; after "
            "average_gradients every rank must hold the same gradient (the result of the same all-reduces)")
    error = max_diff(results[0], expected)
    plain = torch.stack([flat(mean_loss_grads(make_model(), x, y)) for x, y in shards if len(x)]).mean(0)
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
