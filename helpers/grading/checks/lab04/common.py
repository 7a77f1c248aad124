"""Shared pieces of lab 04's checks: the MLP, its data, torch's buckets, run_on_ranks, diagnose.

The rank functions and the assertions take an `offset` (0 here): the grader's hidden tests run the same rank functions
with an offset from their secret seed (other initial weights and data) and judge their reports with the same
assertions (helpers/grading/probes/lab04.py), so the feedback says what the check says."""
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from helpers.errors import CollectiveHang, RankFailed
from helpers.grading.shared_run import RunFailed
from helpers.grading.shared_run import launch_gloo as launch  # starts no ranks for a TODO

HANG_TIMEOUT_S = 10.0
TOL = 1e-6  # float32 sums of a few numbers in another order (DDP multiplies by 1/N, we may divide by N)
SLOW_RANK_S = 0.3  # how long the straggler sleeps; launching an async all-reduce takes microseconds
LAYERS = (6, 10, 10, 7, 3)  # an MLP 6 -> 10 -> 10 -> 7 -> 3: eight tensors of uneven sizes
CAP_BYTES = 400
MLP_BUCKETS = [[7, 6, 5, 4], [3, 2], [1, 0]]  # torch's buckets of the MLP above at CAP_BYTES
CAP_MB = CAP_BYTES / 2**20  # the same cap as Reducer's bucket_cap_mb (exact: a power-of-two scale)
STEPS, LR, BATCH = 3, 0.1, 5


# --------------------------------------------------------------------------------------------- shared pieces
def make_model(seed):
    """The checks' MLP; identical for the same seed."""
    torch.manual_seed(seed)
    layers = []
    for d_in, d_out in zip(LAYERS, LAYERS[1:]):
        layers += [nn.Linear(d_in, d_out), nn.Tanh()]
    return nn.Sequential(*layers[:-1])


def rank_batch(step, rank, offset=0):
    """(x, y) of a rank at a step: different on every rank and at every step (offset: the grader's secret inputs)."""
    generator = torch.Generator().manual_seed(1000 * step + rank + 100_003 * offset)
    return torch.randn(BATCH, LAYERS[0], generator=generator), torch.randn(BATCH, LAYERS[-1], generator=generator)


def torch_buckets(params, cap_bytes):
    """torch's own assignment (DDP's Reducer uses it) of the parameters taken last to first, as lists of indices."""
    # A private torch API: the checks have no rule of their own to fall back on (that rule is lab 4.1's answer).
    compute = getattr(dist, "_compute_bucket_assignment_by_size", None)
    if compute is None:
        raise RuntimeError(f"torch {torch.__version__} has no torch.distributed._compute_bucket_assignment_by_size, "
                           "which lab 04's checks compare with; install the torch pinned in pyproject.toml")
    indices = list(reversed(range(len(params))))
    return [list(b) for b in compute([params[i] for i in indices], [cap_bytes], [], indices)[0]]


def nbytes(t):
    return t.numel() * t.element_size()


def flat(tensors):
    return torch.cat([t.reshape(-1) for t in tensors])


def max_diff(a, b):
    return (a - b).abs().max().item()


def run_on_ranks(fn, world_size, args, what):
    """launch() for checks: Gloo, short hang timeout; a hang or a crash becomes a failure that says what happened."""
    try:
        return launch(fn, world_size, args=args, backend="gloo", hang_timeout=HANG_TIMEOUT_S)
    except CollectiveHang as exc:
        raise RunFailed(
            f"{what} hung at world size {world_size}: some rank issued an "
            f"all-reduce the others did not (a bucket launched twice, or never). Launcher's report:\n{exc}") from None
    except RankFailed as exc:
        if exc.exc_type == "NotImplementedError":
            raise
        raise AssertionError(f"{what} at world size {world_size}: a rank raised: {exc}") from None


def local_grads(params_model, step, rank, offset=0):
    """Gradients of one rank's loss at a step (no communication), for the model's current parameters."""
    params_model.zero_grad(set_to_none=True)
    x, y = rank_batch(step, rank, offset)
    F.mse_loss(params_model(x), y).backward()
    return [p.grad.clone() for p in params_model.parameters()]


def diagnose(got, expected, local, params, world_size):
    """A hint naming the wrong answer that `got` matches, or ''."""
    wrong = {"the average of the PARAMETERS: the hook receives the parameter, copy param.grad, not param": params,
             f"the SUM over ranks: divide by the world size ({world_size})": expected * world_size,
             "this rank's own gradient divided by the world size: the all-reduce had not finished when its buffer was "
             "copied back, so wait() on the work handle first": local / world_size,
             "this rank's own gradient: it was never averaged (a hook that all-reduces `param` instead of `param.grad` "
             "does this)": local}
    return next((f" They equal {name}." for name, value in wrong.items() if max_diff(got, value) <= TOL), "")
