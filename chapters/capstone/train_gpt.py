r"""Train a small GPT on the shipped corpus, data-parallel, four ways; the same code under torchrun or a notebook.

On one machine without a GPU (Gloo, 2 processes), from the repository's root:

    torchrun --standalone --nproc-per-node=2 chapters/capstone/train_gpt.py --steps 20
    torchrun --standalone --nproc-per-node=2 chapters/capstone/train_gpt.py --steps 20 --strategy all

On a cluster, NCCL with one GPU per local rank (run the same command on every node; HOST is node 0):

    torchrun --nnodes=2 --nproc-per-node=8 --rdzv-backend=c10d --rdzv-endpoint=HOST:29500 \
        chapters/capstone/train_gpt.py --strategy fsdp2 --steps 2000 --n-layer 6 --n-head 6 --n-embd 384 \
        --block-size 256 --batch-size 32

Strategies: manual_ddp and manual_fsdp (parallel.py: what you built in chapters 03 and 08), ddp (torch
DistributedDataParallel), fsdp2 (torch fully_shard), or all four in turn. torchrun sets RANK, WORLD_SIZE,
LOCAL_RANK, MASTER_ADDR and MASTER_PORT; we pick NCCL when CUDA is available, Gloo otherwise. Rank 0 prints
a progress line every --log-every steps; every rank prints the sha256 of the final full parameters (equal on
every rank, or data parallelism is broken); rank 0 ends with a table: loss, tokens/s, bytes, memory.
chapters/10_capstone_gpt.ipynb runs `train` on every rank through helpers.launch, and this script under torchrun
(its section 11). --warmup and --decay-to give nanoGPT's learning-rate schedule (the chapter's section 10).
"""
import argparse
import dataclasses
import hashlib
import math
import os
import pathlib
import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

if not __package__:  # run as a script (torchrun, python): make the package `capstone` importable
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
from capstone.data import get_batch, load_corpus  # noqa: E402
from capstone.model import GPT, GPTConfig  # noqa: E402
from capstone.parallel import ManualDDP, ManualFSDP, clip_grad_norm_sharded  # noqa: E402

# rank_device: the rank's GPU under torchrun's "nccl" and under launch's "cpu:gloo,cuda:nccl", else the CPU
from helpers.backend import rank_device  # noqa: E402
from helpers.comm import CommLedger  # noqa: E402
from helpers.memory import state_bytes  # noqa: E402

STRATEGIES = ("manual_ddp", "manual_fsdp", "ddp", "fsdp2")


@dataclasses.dataclass
class TrainConfig:
    steps: int = 20
    batch_size: int = 8       # sequences per rank per step; the global batch is world_size times larger
    block_size: int = 64      # context length T
    n_layer: int = 2
    n_head: int = 4
    n_embd: int = 64          # d_model
    lr: float = 2e-3
    # on every parameter (nanoGPT spares biases and norms; one group keeps flat shards simple)
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    seed: int = 0
    log_every: int = 5
    warmup: int = 0           # steps of linear learning-rate warmup (0: none)
    decay_to: float = 1.0     # cosine decay of the learning rate to lr x decay_to at the last step (1.0: constant)
    keep_every: int = 0       # also return the full parameters after every keep_every steps (0: only the final)
    compile: str = ""         # torch.compile backend for every block, before wrapping ("": eager; on GPUs "inductor")


def build(cfg, strategy, vocab_size, device):
    """The same GPT on every rank (seeded), wrapped by `strategy`."""
    torch.manual_seed(cfg.seed)   # fully_shard keeps each rank's own slice: the ranks must build the same model
    gpt = GPT(GPTConfig(vocab_size, cfg.block_size, cfg.n_layer, cfg.n_head, cfg.n_embd)).to(device)
    if cfg.compile:   # torchtitan's order: compile every block (one graph serves them all), then shard or wrap
        for block in gpt.h:
            block.compile(backend=cfg.compile, fullgraph=True)
    if strategy == "manual_ddp":
        return ManualDDP(gpt)
    if strategy == "manual_fsdp":
        return ManualFSDP(gpt, units=list(gpt.h))   # one unit per block, then the root
    if strategy == "ddp":
        return DDP(gpt, device_ids=[device.index] if device.type == "cuda" else None)
    if strategy == "fsdp2":
        # Imported here, not at the top: a process that imports this module and never builds fsdp2 (the
        # notebook's kernel) does not load FSDP. What that saves, on your machine:
        #   python -X importtime -c "import torch.distributed.fsdp"
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        mesh = init_device_mesh(device.type, (dist.get_world_size(),))
        for block in gpt.h:
            fully_shard(block, mesh=mesh)
        return fully_shard(gpt, mesh=mesh)
    raise ValueError(f"unknown strategy {strategy!r}; use one of {STRATEGIES}")


def learning_rate(cfg, step):
    """nanoGPT's schedule: linear warmup over cfg.warmup steps, then a cosine from cfg.lr to cfg.lr x cfg.decay_to."""
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    progress = (step - cfg.warmup) / max(1, cfg.steps - 1 - cfg.warmup)       # 0 -> 1 over the rest of the run
    return cfg.lr * (cfg.decay_to + (1 - cfg.decay_to) * 0.5 * (1 + math.cos(math.pi * progress)))


def train_step(model, strategy, x, y, optimizer, grad_clip):
    """One step on this rank's batch; returns this rank's loss (a 0-d tensor)."""
    _, loss = model(x, y)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()          # ddp: all-reduced in here; manual_fsdp and fsdp2: gathered and reduce-scattered in here
    if strategy == "manual_ddp":
        model.sync_gradients()
    if strategy == "manual_fsdp":
        clip_grad_norm_sharded(list(model.parameters()), grad_clip)   # the norm of ALL shards, not of mine
    else:
        torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)  # after averaging; fsdp2: DTensor norm
    optimizer.step()
    return loss.detach()


def full_parameters(model, strategy):
    """{name: full tensor on the CPU}, in the GPT's parameter order; sharded strategies gather the shards."""
    if strategy == "manual_fsdp":
        params = model.full_parameters()
    elif strategy == "fsdp2":
        params = {n: p.full_tensor() for n, p in model.named_parameters()}
    else:
        params = dict(model.module.named_parameters())
    return {n: p.detach().cpu() for n, p in params.items()}


def flat_parameters(model, strategy):
    """Every parameter, gathered if sharded, as one flat CPU vector in the GPT's order (vector_to_parameters)."""
    return torch.cat([p.reshape(-1) for p in full_parameters(model, strategy).values()])


def say(text):
    """Print a line in ONE write: the ranks share torchrun's stdout, and split writes interleave."""
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


def progress(strategy, step, steps, loss):
    """A text progress line (rank 0); it streams live through torchrun and through helpers.launch."""
    done = round(20 * step / steps)
    say(f"[{strategy:11s}] step {step:4d}/{steps} |{'#' * done}{'.' * (20 - done)}| loss {loss:.3f} (rank 0's batch)")


def train(cfg, strategy, corpus=None):
    """Run on every rank: train `cfg.steps` steps; return losses, speed, bytes, memory and final parameters.

    corpus: (tokenizer, character ids to train on), the whole corpus by default. With cfg.keep_every, "kept" holds
    {step: every parameter after `step` steps, flat} at 0, keep_every, 2 keep_every, ... and cfg.steps.
    """
    rank, world_size, device = dist.get_rank(), dist.get_world_size(), rank_device()
    tokenizer, data = corpus if corpus is not None else load_corpus()   # (tokenizer, the ids to train on)
    with CommLedger() as setup:
        model = build(cfg, strategy, tokenizer.vocab_size, device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=(0.9, 0.95), weight_decay=cfg.weight_decay)
    losses, comm, seconds, kept = [], [], [], {}
    cpu_start = time.process_time()
    for step in range(cfg.steps):
        if cfg.keep_every and step % cfg.keep_every == 0:   # the parameters that step `step` starts from
            kept[step] = flat_parameters(model, strategy)
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(cfg, step)
        x, y = (t.to(device) for t in get_batch(data, rank, world_size, step, cfg.batch_size, cfg.block_size, cfg.seed))
        start = time.perf_counter()
        with CommLedger() as ledger:
            losses.append(train_step(model, strategy, x, y, optimizer, cfg.grad_clip))
        if device.type == "cuda":
            torch.cuda.synchronize()
        seconds.append(time.perf_counter() - start)
        comm.append(ledger.totals())
        if rank == 0 and ((step + 1) % cfg.log_every == 0 or step + 1 == cfg.steps):
            progress(strategy, step + 1, cfg.steps, losses[-1].item())
    # After the loop, outside the ledgers: the global batch's loss per step, and each step's time on its slowest
    # rank (step 0 excluded: it pays for first calls); tokens/s from the median step, robust to a busy machine.
    losses, seconds = torch.stack(losses), torch.tensor(seconds[1:] or seconds, device=device)
    dist.all_reduce(losses)
    dist.all_reduce(seconds, op=dist.ReduceOp.MAX)
    cpu_seconds = time.process_time() - cpu_start
    flat = flat_parameters(model, strategy)
    kept[cfg.steps] = flat
    return {"strategy": strategy, "losses": (losses / world_size).tolist(), "num_params": flat.numel(),
            "tokens_per_s": world_size * cfg.batch_size * cfg.block_size / seconds.median().item(),
            "comm_setup": setup.totals(), "comm": comm,
            "state": state_bytes(model.module if strategy == "ddp" else model, optimizer),
            "sha256": hashlib.sha256(flat.numpy().tobytes()).hexdigest()[:16], "params": flat,
            "kept": kept if cfg.keep_every else {}, "cpu_seconds": cpu_seconds,
            "graphs": compiled_graphs() if cfg.compile else 0}


def compiled_graphs():
    """Graphs torch.compile has made in this process (Dynamo's own count)."""
    from torch._dynamo.utils import counters

    return counters["stats"]["unique_graphs"]


def summary_table(results):
    """One row per strategy: first and last loss, tokens/s (median step), bytes sent in the last step, state held."""
    lines = [f"{'strategy':12s}{'loss first':>11s}{'last':>7s}{'tokens/s':>10s}{'sent B/step':>13s}"
             f"{'params B':>10s}{'grads B':>9s}{'optim B':>9s}{'total B':>9s}  sha256 of parameters"]
    for r in results:
        sent = sum(t["wire_bytes"] for t in r["comm"][-1].values())
        s = r["state"]
        lines.append(f"{r['strategy']:12s}{r['losses'][0]:11.3f}{r['losses'][-1]:7.3f}{r['tokens_per_s']:10.0f}"
                     f"{sent:13d}{s['params']:10d}{s['grads']:9d}{s['optimizer']:9d}{s['total']:9d}  {r['sha256']}")
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for field in dataclasses.fields(TrainConfig):
        parser.add_argument(f"--{field.name.replace('_', '-')}", type=field.type, default=field.default)
    parser.add_argument("--strategy", choices=(*STRATEGIES, "all"), default="manual_ddp")
    args = parser.parse_args(argv)
    cfg = TrainConfig(**{f.name: getattr(args, f.name) for f in dataclasses.fields(TrainConfig)})
    owns_group = not dist.is_initialized()   # under helpers.launch the group exists already
    if owns_group:
        backend = "nccl" if torch.cuda.is_available() else "gloo"
        if backend == "nccl":
            torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))   # one GPU per local rank
        else:
            torch.set_num_threads(1)                                # the ranks share the CPU cores
        dist.init_process_group(backend)                            # env://: RANK, WORLD_SIZE, MASTER_ADDR, ...
    rank = dist.get_rank()
    if rank == 0:
        say(f"{dist.get_world_size()} ranks, backend {dist.get_backend()}, {cfg}")
    results = []
    for strategy in STRATEGIES if args.strategy == "all" else (args.strategy,):
        results.append(train(cfg, strategy))
        compiled = f", {results[-1]['graphs']} compiled graph(s)" if cfg.compile else ""
        say(f"rank {rank}: {strategy} loss {results[-1]['losses'][0]:.4f} -> {results[-1]['losses'][-1]:.4f} "
            f"parameters sha256 {results[-1]['sha256']}{compiled}")
    dist.barrier()
    if rank == 0:
        say(summary_table(results))
    if owns_group:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
    # torch 2.13: once torch._dynamo is imported (optimizer.step imports it) the Gloo group outlives
    # destroy_process_group, and its threads race the interpreter's teardown. Measured here: 4 of 95 runs of
    # `torchrun --nproc-per-node=2 train_gpt.py --strategy all` (a tiny model) on 2 cores (more often when busy) ended
    # in SIGABRT ("terminate called without an active exception") after every line was printed. All is said and the
    # group is destroyed: leave without the teardown.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
