r"""Training that survives a crash: a checkpoint after every step, and a restart resumes from the newest one.

From the repository's root; rank 1 dies in the middle of step 2 of the first attempt, torchrun restarts both:

    torchrun --standalone --nproc-per-node=2 --max-restarts=2 chapters/ops/resumable.py \
        --steps 4 --crash-rank 1 --crash-at 2 --ckpt artifacts/ops/ckpt --out artifacts/ops/resumed.pt

What a resume needs, and where it lives in the checkpoint (torch.distributed.checkpoint, DCP):
    model      "model"          parameters and buffers (get_state_dict: the same keys with or without DDP)
    optimizer  "optim"          AdamW's two moments and step count per parameter
    data       "step"           the next step; the batch of a step is a function of (seed, step), so the step
                                is the data position (a DataLoader's would be its sampler's epoch and offset)
    RNG        "rng_rank<r>"    each rank's CPU generator (dropout masks differ per rank); CUDA's too on GPUs
A checkpoint directory is complete once DCP has written its `.metadata` file: FileSystemWriter.finish
(torch/distributed/checkpoint/filesystem.py) writes it last, after every rank's data, through a rename, so a
crash during a save leaves a directory without it, which `latest_checkpoint` skips.
torchrun tells a restarted worker which attempt it is in TORCHELASTIC_RESTART_COUNT (0 on the first).
"""
import argparse
import os
import pathlib
import sys

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.nn.functional as F
from torch import nn
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.nn.parallel import DistributedDataParallel as DDP

if not __package__:  # run as a script (torchrun): make the package `ops` importable
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
from helpers.backend import rank_device  # noqa: E402
from ops.train_script import (  # noqa: E402
    HIDDEN,
    IN,
    SEED,
    checkpoint_dir,
    exit_now,
    finish,
    init_from_env,
    rank_batch,
    say,
)

BATCH_PER_RANK = 8
LR = 0.02
DROPOUT = 0.1       # random masks: without the RNG state in the checkpoint, a resumed run would differ


def make_model(device):
    """An MLP with dropout, the same on every rank."""
    torch.manual_seed(SEED)
    return nn.Sequential(nn.Linear(IN, HIDDEN), nn.Tanh(), nn.Dropout(DROPOUT), nn.Linear(HIDDEN, 1)).to(device)


def latest_checkpoint(root):
    """The newest complete checkpoint directory under root (one with DCP's .metadata), or None."""
    done = sorted(p for p in pathlib.Path(root).glob("step_*") if (p / ".metadata").exists()) if root else []
    return done[-1] if done else None


def rng_keys(rank, device):
    """The names under which this rank's generators are saved: per rank, since every rank's differ."""
    return {f"rng_rank{rank}": None, **({f"cuda_rng_rank{rank}": device} if device.type == "cuda" else {})}


def save(path, model, optimizer, step, rank, device):
    """Every rank calls it (a collective): model, optimizer, next step and this rank's RNG states."""
    model_state, optim_state = get_state_dict(model, optimizer)
    state = {"model": model_state, "optim": optim_state, "step": step}
    for key, cuda in rng_keys(rank, device).items():
        state[key] = torch.cuda.get_rng_state(cuda) if cuda else torch.get_rng_state()
    dcp.save(state, checkpoint_id=path)


def load(path, model, optimizer, rank, device, skip=()):
    """Restore what `save` wrote, in place, but for the parts named in skip ("optim", "rng"); returns the step."""
    model_state, optim_state = get_state_dict(model, optimizer)
    state = {"model": model_state, "optim": optim_state, "step": 0}
    state.update({key: (torch.cuda.get_rng_state(cuda) if cuda else torch.get_rng_state())
                  for key, cuda in rng_keys(rank, device).items()})
    dcp.load(state, checkpoint_id=path)    # tensors are filled in place; "step" is replaced by the saved value
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
    if "optim" in skip:   # chapter 11 shows what a resume without it gives: AdamW starts again, no moments
        optimizer.state.clear()
    if "rng" not in skip:
        for key, cuda in rng_keys(rank, device).items():
            if cuda:
                torch.cuda.set_rng_state(state[key], cuda)
            else:
                torch.set_rng_state(state[key])
    return state["step"]


def train(steps, ckpt=None, crash_rank=None, crash_at=None, skip=()):
    """DDP + AdamW with dropout; checkpoints after every step into ckpt/step_<next step> when ckpt is given.

    Resumes from the newest complete checkpoint under ckpt, restoring all of it but the parts named in skip."""
    rank, world_size, device = dist.get_rank(), dist.get_world_size(), rank_device()
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    model = DDP(make_model(device), device_ids=[device.index] if device.type == "cuda" else None)
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR)
    torch.manual_seed(SEED + 1 + rank)     # dropout: different masks on every rank, the same on every run
    latest = latest_checkpoint(ckpt)
    start = load(latest, model, optimizer, rank, device, skip) if latest else 0
    if rank == 0:
        say(f"attempt {attempt}: starting at step {start}" + (f" from {latest.name}" if latest else ""))
    for step in range(start, steps):
        x, y = rank_batch(step, rank, world_size, BATCH_PER_RANK, device)
        loss = F.mse_loss(model(x), y)
        if rank == crash_rank and step == crash_at and attempt == 0:
            say(f"rank {rank}: dying in the middle of step {step} (os._exit), attempt {attempt}")
            os._exit(1)                    # no exception, no cleanup: as a killed process or a lost node
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if ckpt:
            save(pathlib.Path(ckpt) / f"step_{step + 1:06d}", model, optimizer, step + 1, rank, device)
    return nn.utils.parameters_to_vector(model.parameters()).detach().cpu()


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--ckpt", type=checkpoint_dir, required=True, help="directory of the checkpoints")
    parser.add_argument("--crash-rank", type=int, default=None)
    parser.add_argument("--crash-at", type=int, default=None, help="the step in which --crash-rank dies")
    parser.add_argument("--out", type=pathlib.Path, help="rank 0 saves the final parameters here")
    args = parser.parse_args(argv)
    init_from_env()
    finish(train(args.steps, args.ckpt, args.crash_rank, args.crash_at), args.out)


if __name__ == "__main__":
    main()
    exit_now()
