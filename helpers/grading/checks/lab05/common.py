"""Shared pieces of lab 05's checks: the classifier, its data, run_on_ranks, a plain SGD step."""
import torch
import torch.nn as nn

from helpers.errors import CollectiveHang, RankFailed
from helpers.grading.shared_run import RunFailed
from helpers.grading.shared_run import launch_gloo as launch  # starts no ranks for a TODO

TOL = 1e-5  # float32 parameters of size ~0.3 after 2-3 SGD steps; sums in another order differ by ~1e-7
HANG_TIMEOUT = 15.0  # seconds without progress before a check reports a hang
D_IN, HIDDEN, N_CLASSES = 6, 32, 3
# Added to the seeds of the checks' models and data: 0 here. The grader's hidden tests run these checks with it set
# from their secret seed (helpers/grading/judge/replay.py), so they say what the check says of other weights and data.
OFFSET = 0


# ---------------------------------------------------------------------------------------------- shared pieces
def make_model(seed=0):
    """A tiny classifier, identical on every rank for the same seed."""
    torch.manual_seed(seed + 1_000_003 * OFFSET)
    return nn.Sequential(nn.Linear(D_IN, HIDDEN), nn.Tanh(), nn.Linear(HIDDEN, HIDDEN), nn.Tanh(),
                         nn.Linear(HIDDEN, N_CLASSES))


def make_batch(n, seed):
    """n samples: x (n, D_IN), labels y (n,)."""
    g = torch.Generator().manual_seed(seed + 1_000_003 * OFFSET)
    return torch.randn(n, D_IN, generator=g), torch.randint(0, N_CLASSES, (n,), generator=g)


def flat_params(model):
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def max_diff(a, b):
    return (a - b).abs().max().item()


def run_on_ranks(fn, world_size, args=()):
    """launch() for checks: Gloo, short hang timeout; a hang or a crash becomes a failure that says what to look at."""
    try:
        return launch(fn, world_size, args=args, backend="gloo", hang_timeout=HANG_TIMEOUT)
    except CollectiveHang as exc:
        raise RunFailed(
            "the ranks hung: they did not issue the same collectives, most likely an all-reduce at every micro-batch "
            "(no no_sync(), or no_sync() around the backward only). Ranks "
            "may hold different numbers of micro-batches, so every rank must run exactly one synchronised backward "
            "per step: all micro-batches but the last inside no_sync() (forward and backward), the last outside it. "
            f"Launcher's report:\n{exc}") from None
    except RankFailed as exc:
        if exc.exc_type == "NotImplementedError":
            raise
        raise AssertionError(f"a rank raised: {exc}") from None


def sgd_step(model, lr):
    with torch.no_grad():
        for p in model.parameters():
            p -= lr * p.grad
