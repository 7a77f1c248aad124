"""Shared pieces of lab 01's checks: the classifier, its data, the one-process gradient, run_on_ranks.

The runs and the assertions take an `offset` (0 here): the grader's hidden tests run the same functions with an offset
from their secret seed (other weights and data) and judge the results with the same assertions
(helpers/grading/probes/lab01.py), so the feedback says what the check says."""
import torch
import torch.nn as nn
import torch.nn.functional as F

from helpers.errors import CollectiveHang, RankFailed
from helpers.grading.shared_run import launch_gloo as launch  # starts no ranks for a TODO
from helpers.grading.shared_run import run_failed

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


def full_batch_grads(shards, seed=0):  # seed: the model's
    """One process on the concatenation of all shards: the gradient every answer must reproduce."""
    x = torch.cat([s[0] for s in shards])
    y = torch.cat([s[1] for s in shards])
    return mean_loss_grads(make_model(seed), x, y)


def flat(tensors):
    return torch.cat([t.reshape(-1) for t in tensors])


def max_diff(a, b):
    return (a - b).abs().max().item()


# What a run that did not finish says first (the grader's hidden tests say it too).
HANG_HINT = ("some rank skipped or reordered a collective. Every rank must call the same collectives in the same "
             "order, also a rank with no data or with p.grad None. ")


def run_on_ranks(fn, world_size, args=()):
    """launch() for checks: Gloo, short hang timeout; a hang becomes a failure that says what to look for."""
    try:
        return launch(fn, world_size, args=args, backend="gloo", hang_timeout=HANG_TIMEOUT)
    except CollectiveHang as exc:
        raise run_failed(exc, HANG_HINT) from None
    except RankFailed as exc:
        if exc.exc_type == "NotImplementedError":
            raise
        if exc.exitcode is not None:
            raise run_failed(exc) from None
        raise AssertionError(f"a rank raised: {exc}") from None
