"""Shared pieces of lab 13's checks: the task, DDP with a hook under the ledger, and the reference algorithms.

The references are the chapter's algorithms (chapters/13_compression_and_local_steps.ipynb), written once here with
switches for the usual mistakes: the checks run the right version and the wrong ones on the same ranks and batches,
and a wrong answer is named by the wrong version it equals.
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


def orthogonalize(matrix):
    """Gram-Schmidt on the columns of matrix (n x r), in place (the lab's, and powerSGD_hook's at rank <= 2)."""
    for i in range(matrix.shape[1]):
        col = matrix[:, i:i + 1]
        col /= torch.linalg.vector_norm(col, dim=0, keepdim=True)
        rest = matrix[:, i + 1:]
        rest -= (col * rest).sum(dim=0, keepdim=True) * col


def worth_compressing(n, m, rank=PSGD_RANK):
    """powerSGD_hook's _should_compress: (n + m) r numbers, times the minimum rate, below n m."""
    return (n + m) * min(n, m, rank) * MIN_COMPRESSION_RATE < n * m


def _all_reduce_views(tensors, world=None):
    buffer = torch.cat([t.reshape(-1) for t in tensors])
    dist.all_reduce(buffer)
    if world is not None:
        buffer /= world
    for t, part in zip(tensors, buffer.split([t.numel() for t in tensors])):
        t.copy_(part.view_as(t))


def reference_powersgd_hook(state, bucket, mistake=None):
    """The lab's powersgd_hook; `mistake` switches one part to a usual wrong version (see MISTAKES_13_2)."""
    world = dist.get_world_size()
    buffer = bucket.buffer()
    if state.iter < state.start_iter and mistake != "compressed from the first step":
        state.iter += bucket.is_last()
        buffer.div_(world)
        return dist.all_reduce(buffer, async_op=True).get_future().then(lambda fut: fut.value()[0])
    i = bucket.index()
    if i in state.errors and mistake != "no error feedback":
        buffer += state.errors[i]
    before = buffer.clone()
    views = [g.view(g.shape[0], -1) for g in bucket.gradients()]
    matrices = [v for v in views if worth_compressing(*v.shape, state.rank)]
    _all_reduce_views([v for v in views if not worth_compressing(*v.shape, state.rank)], world)
    if i not in state.qs or mistake == "no warm start":
        g = torch.Generator().manual_seed(int(state.rng.randint(1_000_000_000)))
        state.qs[i] = [torch.randn(m.shape[1], min(*m.shape, state.rank), generator=g) for m in matrices]
    qs = state.qs[i]
    for q in qs:
        orthogonalize(q)
    ps = [m @ q for m, q in zip(matrices, qs)]
    _all_reduce_views(ps)
    if mistake != "P not orthogonalised":
        for p in ps:
            orthogonalize(p)
    state.qs[i] = qs = [m.T @ p for m, p in zip(matrices, ps)]
    _all_reduce_views(qs, None if mistake == "Q not divided" else world)
    for m, p, q in zip(matrices, ps, qs):
        m.copy_(p @ q.T)
    state.errors[i] = before - buffer
    done = torch.futures.Future()
    done.set_result(buffer)
    return done
