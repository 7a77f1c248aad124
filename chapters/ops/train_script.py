r"""A data-parallel training script: the entry point torchrun starts, and the function helpers.launch runs.

On one machine, from the repository's root (Gloo on the CPU, NCCL when each process has a GPU):

    torchrun --standalone --nproc-per-node=2 chapters/ops/train_script.py --steps 8 --out artifacts/ops/params.pt

torchrun starts --nproc-per-node processes and gives each one, in its environment, what init_process_group
needs: RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT (its default init_method "env://" reads them), and
LOCAL_RANK (which GPU of this machine is ours). `train` does not care who started it: chapter 11 also runs it
on helpers.launch's ranks, whose process group exists already, and gets the same parameters bit for bit.
"""
import argparse
import hashlib
import os
import pathlib
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

# rank_device: the GPU of this rank under NCCL, else the CPU (helpers is installed with the course)
from helpers.backend import rank_device

SEED = 0
IN, HIDDEN = 8, 16        # a 2-layer MLP: 8 -> 16 -> 1
BATCH_PER_RANK = 8        # rows per rank per step; the global batch is world_size times larger
LR = 0.05


def checkpoint_dir(text):
    """A --ckpt directory; an empty one (pathlib reads "" as ".") would scatter step_* directories in the cwd."""
    if not text.strip():
        raise argparse.ArgumentTypeError("give a directory for the checkpoints, e.g. --ckpt artifacts/ops/ckpt")
    return pathlib.Path(text)


def make_model(device):
    """The same small MLP on every rank (same seed)."""
    torch.manual_seed(SEED)
    return nn.Sequential(nn.Linear(IN, HIDDEN), nn.Tanh(), nn.Linear(HIDDEN, 1)).to(device)


def global_batch(step, size):
    """The global batch of `step`, drawn from (SEED, step) alone: every rank computes the same one, on the CPU."""
    g = torch.Generator().manual_seed(1000 * SEED + step)
    x = torch.randn(size, IN, generator=g)                     # (size, IN)
    return x, x.sum(dim=1, keepdim=True).sin()                 # targets: (size, 1)


def rank_batch(step, rank, world_size, batch_per_rank, device):
    """This rank's rows of the global batch of `step`, on its device."""
    x, y = global_batch(step, world_size * batch_per_rank)
    rows = slice(rank * batch_per_rank, (rank + 1) * batch_per_rank)
    return x[rows].to(device), y[rows].to(device)


def train(steps, batch_per_rank=BATCH_PER_RANK, log_every=4):
    """DDP + SGD with momentum for `steps` steps; returns the final parameters as one CPU vector."""
    rank, world_size, device = dist.get_rank(), dist.get_world_size(), rank_device()
    model = DDP(make_model(device), device_ids=[device.index] if device.type == "cuda" else None)
    optimizer = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)
    for step in range(steps):
        x, y = rank_batch(step, rank, world_size, batch_per_rank, device)
        loss = F.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()                    # DDP averages the gradients over the ranks here
        optimizer.step()
        if rank == 0 and step % log_every == 0:   # rank-0-only logging: one line, not one per rank
            say(f"step {step}: loss on rank 0's rows {loss.item():.4f}")
    return nn.utils.parameters_to_vector(model.parameters()).detach().cpu()


def init_from_env():
    """What torchrun asks of a script: one process group from the environment, one GPU per local rank."""
    if torch.cuda.is_available():
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
        dist.init_process_group("nccl")
    else:
        torch.set_num_threads(1)           # the ranks share the CPU cores
        dist.init_process_group("gloo")    # init_method "env://": RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT


def say(text):
    """Print a line in ONE write: torchrun's workers run unbuffered (python -u) and share its stdout, and a
    print's text and newline, written apart, interleave with another rank's line."""
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


def sha256(t):
    """The first 16 hex digits of the sha256 of a tensor's bytes: equal checksums, equal tensors."""
    return hashlib.sha256(t.numpy().tobytes()).hexdigest()[:16]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--out", type=pathlib.Path, help="rank 0 saves the final parameters here (torch.save)")
    args = parser.parse_args(argv)
    init_from_env()
    rank = dist.get_rank()
    env = {k: os.environ[k] for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    say(f"rank {rank}: pid {os.getpid()}, backend {dist.get_backend()}, environment {env}")
    finish(train(args.steps), args.out)


def finish(params, out):
    """Every rank prints its checksum; rank 0 alone saves (one file, not one per rank); the group is destroyed."""
    say(f"rank {dist.get_rank()}: final parameters sha256 {sha256(params)}")
    if dist.get_rank() == 0 and out:
        out.parent.mkdir(parents=True, exist_ok=True)
        torch.save(params, out)
    dist.destroy_process_group()


def exit_now():
    """Leave without the interpreter's teardown: in torch 2.13 a Gloo group can outlive destroy_process_group and
    race it (chapters/capstone/train_gpt.py measured SIGABRTs after the last line)."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
    exit_now()
