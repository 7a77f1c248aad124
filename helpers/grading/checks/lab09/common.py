"""Shared pieces of lab 09's checks: the residual MLP, each rank's batches, run_on_ranks."""
import math

import torch
from torch import nn

from helpers.errors import CollectiveHang, RankFailed
from helpers.grading.shared_run import RunFailed
from helpers.grading.shared_run import launch_gloo as launch  # starts no ranks for a TODO

HANG_TIMEOUT_S = 20.0
FP32_ADAM = {"k": 8, "param_bytes": 4, "grad_bytes": 4}  # fp32 parameters and gradients, Adam's two fp32 moments
LR, STEPS, BATCH = 0.01, 3, 6
TOL = 1e-5  # max |parameters - torch DDP's| after STEPS Adam steps (float32 sums in another order, through Adam)
D_IN, WIDTH, DEPTH, D_OUT = 5, 10, 2, 3
OPS = ("all_gather", "reduce_scatter", "all_reduce")


# --------------------------------------------------------------------------------------------- shared pieces
class Layer(nn.Module):
    """The checks' block type: a residual two-layer MLP."""

    def __init__(self, width):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(width, 2 * width), nn.Linear(2 * width, width)

    def forward(self, x):
        return x + self.fc2(torch.tanh(self.fc1(x)))


class Net(nn.Module):
    """embed -> DEPTH Layers -> head: the root unit holds embed and head."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Linear(D_IN, WIDTH)
        self.layers = nn.ModuleList(Layer(WIDTH) for _ in range(DEPTH))
        self.head = nn.Linear(WIDTH, D_OUT)

    def forward(self, x):
        x = self.embed(x)
        for layer in self.layers:
            x = layer(x)
        return self.head(x)


# Added to the seeds of the checks' nets and data: 0 here. The grader's hidden tests run these checks with it set
# from their secret seed (helpers/grading/judge/replay.py), so they say what the check says of other weights and data.
OFFSET = 0


def make_net():
    torch.manual_seed(1_000_003 * OFFSET)
    return Net()


def rank_batches(rank, steps=STEPS):
    """This rank's batches: different on every rank and at every step."""
    generator = torch.Generator().manual_seed(900 + rank + 1_000_003 * OFFSET)
    return [(torch.randn(BATCH, D_IN, generator=generator), torch.randn(BATCH, D_OUT, generator=generator))
            for _ in range(steps)]


def num_params(model):
    return sum(p.numel() for p in model.parameters())


def padded_num_params(model, shards):
    """Parameters counted as FSDP stores them: every dim 0 rounded up to a multiple of `shards`."""
    return sum(math.ceil(p.shape[0] / shards) * shards * (p.numel() // p.shape[0]) for p in model.parameters())


def run_on_ranks(fn, world_size, args, what):
    """launch() for checks: Gloo, short hang timeout; a hang or a crash becomes a failure that says what happened."""
    try:
        return launch(fn, world_size, args=args, backend="gloo", hang_timeout=HANG_TIMEOUT_S)
    except CollectiveHang as exc:
        raise RunFailed(f"{what} hung at world size {world_size}: the ranks did not issue the same collectives. "
                        f"Launcher's report:\n{exc}") from None
    except RankFailed as exc:
        if exc.exc_type == "NotImplementedError":
            raise
        raise AssertionError(f"{what} at world size {world_size}: a rank raised: {exc}") from None
