"""Checks of lab 1.2: global_token_mean_loss, a token-normalised loss over every rank's tokens."""
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from helpers.grading.checks.lab01.common import D_EMBED, TOL, VOCAB, flat_grad, max_diff, run_on_ranks
from helpers.grading.registry import answer, public_check


# ------------------------------------------------------------------------------------------------ question 1.2
def make_lm(offset=0):
    torch.manual_seed(offset)
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


def token_rank(fn, rank_lengths, bool_mask, offset=0):
    """On each rank: the student's loss on this rank's sequences, backward, gradients averaged as DDP does."""
    rank, world_size = dist.get_rank(), dist.get_world_size()
    model = make_lm(offset)
    width = max(max(lengths) for lengths in rank_lengths)  # every rank pads to the same length
    losses, mask = lm_token_losses(model, *make_sequences(rank_lengths[rank], seed=50 + rank + 10 * offset,
                                                          width=width))
    loss = fn(losses, mask.bool() if bool_mask else mask)
    assert isinstance(loss, torch.Tensor) and loss.dim() == 0, (
        f"global_token_mean_loss must return a scalar tensor, got {type(loss).__name__} "
        f"{tuple(getattr(loss, 'shape', ()))}")
    loss.backward()
    g = flat_grad(model)
    dist.all_reduce(g)
    return g / world_size, loss.detach()


def token_reference(rank_lengths, offset=0):
    """One process: the token mean over all ranks' tokens; also the usual wrong answers, for hints."""
    model = make_lm(offset)
    width = max(max(lengths) for lengths in rank_lengths)
    per_rank = [lm_token_losses(model, *make_sequences(lengths, seed=50 + r + 10 * offset, width=width))
                for r, lengths in enumerate(rank_lengths)]
    total = sum(m.sum() for _, m in per_rank)
    loss = sum((losses * m).sum() for losses, m in per_rank) / total
    model.zero_grad()
    loss.backward(retain_graph=True)  # the wrong variants below reuse the graph
    right = flat_grad(model)
    wrong = {"the correct gradient divided by the world size: DDP divides the summed gradients by the world "
             "size, so multiply this rank's share of the loss by it": right / len(rank_lengths)}
    model.zero_grad()
    (sum(losses.sum() for losses, _ in per_rank) / sum(m.numel() for _, m in per_rank)).backward(retain_graph=True)
    wrong["the mean over every position, padding included: multiply the losses by the mask and count only the "
          "real tokens"] = flat_grad(model)
    if all(m.sum() > 0 for _, m in per_rank):
        model.zero_grad()
        (sum((losses * m).sum() / m.sum() for losses, m in per_rank) / len(per_rank)).backward()
        wrong["the average of per-rank token means: tokens on ranks with few tokens weigh more; divide by the "
              "all-reduced token count instead"] = flat_grad(model)
    return loss.item(), right, wrong


def check_tokens(ns, rank_lengths, bool_mask):
    fn = answer(ns, "global_token_mean_loss")
    check_token_results(run_on_ranks(token_rank, len(rank_lengths), args=(fn, rank_lengths, bool_mask)), rank_lengths)


def check_token_results(results, rank_lengths, offset=0):
    """The assertions on token_rank's results (the grader's hidden test runs them too)."""
    value, expected, wrong = token_reference(rank_lengths, offset)
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
