"""Shared pieces of lab 13's checks: the task, DDP with a hook under the ledger, the states the hooks get.

No answer is written here: the checks compare with PyTorch's own hooks and averager (with a switch turned off to name
a mistake) and with rules computed from what the student's hook received and returned (release.py's policy).
"""
import types

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from helpers.grading.shared_run import SharedRun, launch_on_gloo

WORLD_SIZE = 3  # odd: a division by 2 instead of the world size shows, and three ranks see three different batches
HANG_S = 20.0  # a check whose ranks wait longer than this reports CollectiveHang instead of hanging
# float32 parameters of size about 1 after a few SGD steps: the same sums in another order differ by a few roundings
# of 2**-24 (about 6e-8); 1e-6 allows that and is far below any real bug (chapter 03, section 6).
TOL = 1e-6
D_IN, HIDDEN, D_OUT, ROWS, LR = 8, 16, 4, 6, 0.1

_memoized = SharedRun()  # one launch serves every check of a question

# Added to every seed of the checks' models and data: 0 here. The grader's hidden tests run the same rank functions
# with it set from their secret seed (on the ranks), and the checks themselves on their results with the same value
# (in the grader: probes/judges.by_public_checks), so the feedback says what the check says.
OFFSET = 0


def _launch(fn, *args, hint=""):
    """Run fn on WORLD_SIZE Gloo ranks; a hang or a dead rank becomes a failure that says what to look at."""
    return launch_on_gloo(fn, WORLD_SIZE, args, HANG_S, hint)


def make_model():
    """8 -> 16 -> 16 -> 4: three weight matrices (PowerSGD compresses 16 x 8 and 16 x 16 at rank 2), three biases."""
    torch.manual_seed(13 + OFFSET)  # the same start on every rank
    return nn.Sequential(nn.Linear(D_IN, HIDDEN), nn.Tanh(), nn.Linear(HIDDEN, HIDDEN), nn.Tanh(),
                         nn.Linear(HIDDEN, D_OUT))


def batch(rank, step):
    """Rank `rank`'s batch at step `step`: different on every rank."""
    g = torch.Generator().manual_seed(100_000 * OFFSET + 100 * rank + step + 1)
    x = torch.randn(ROWS, D_IN, generator=g)
    return x, 3 * torch.sin(x[:, :D_OUT] + x[:, D_OUT:])


def numel():
    return sum(p.numel() for p in make_model().parameters())


def flat(tensors):
    return torch.cat([t.detach().reshape(-1).cpu() for t in tensors])


def max_diff(a, b):
    return (a.double() - b.double()).abs().max().item()


def train_ddp(hook, state, steps, after_step=None):
    """This rank's DDP run with `hook` (None: DDP's own all-reduce), SGD: final parameters, and per step the
    all-reduces the ledger saw ([(dtype, payload bytes)]); after_step(step) runs after each step."""
    from torch.nn.parallel import DistributedDataParallel

    from helpers.comm import CommLedger

    model = DistributedDataParallel(make_model())
    if hook is not None:
        model.register_comm_hook(state, hook)
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    per_step = []
    for step in range(steps):
        x, y = batch(dist.get_rank(), step)
        optimizer.zero_grad()
        with CommLedger() as ledger:
            F.mse_loss(model(x), y).backward()
        optimizer.step()
        per_step.append([(str(r.dtype).removeprefix("torch."), r.payload_bytes) for r in ledger.records
                         if r.op == "all_reduce"])
        if after_step is not None:
            after_step(step)
    return {"params": flat(model.parameters()), "all_reduces": per_step}


# --- 13.1: a 16-bit cast on the wire, with error feedback ---------------------------------------------------------

def compress_state(dtype, error_feedback):
    """The fields of the lab's CompressState: the hook reads and writes only these."""
    return types.SimpleNamespace(dtype=dtype, error_feedback=error_feedback, residuals={}, iter=0)


# --- 13.2: PowerSGD ------------------------------------------------------------------------------------------------

PSGD_RANK, PSGD_START, MIN_COMPRESSION_RATE = 2, 2, 2


def powersgd_state(rank=PSGD_RANK, start_iter=PSGD_START, seed=0):
    """The fields of the lab's PowerSGDState: the hook and the lab's given helpers read and write only these."""
    return types.SimpleNamespace(rank=rank, start_iter=start_iter, min_compression_rate=MIN_COMPRESSION_RATE,
                                 rng=np.random.RandomState(seed), iter=0, errors={}, qs={})


def worth_compressing(n, m, rank=PSGD_RANK):
    """powerSGD_hook's _should_compress: (n + m) r numbers, times the minimum rate, below n m."""
    return (n + m) * min(n, m, rank) * MIN_COMPRESSION_RATE < n * m
