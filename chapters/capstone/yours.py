"""Train the capstone GPT with YOUR components (lab 10), and with PyTorch's counterpart of each.

What lab 10 calls of your code, and nothing else (the names labs 04, 07 and 08 fixed):

    kind       you bring (lab)              lab 10 calls
    reducer    Reducer (04)                 Reducer(model, bucket_cap_mb); reducer.finalize(); reducer.buckets
    zero2      reduce_scatter_gradients,    grad_shard = reduce_scatter_gradients(params);
               zero_adamw_step (07)         zero_adamw_step(params, grad_shard, state, lr=, weight_decay=, betas=)
    flatshard  FlatShard (08)               FlatShard(module); unit.unshard(), .reshard(), .reduce_scatter_grads();
                                            unit.flat_shard, unit.flat, unit.numel

Each run is one small class with the same methods: `step(x, y)` (one training step; this rank's loss), `state()`
(helpers.memory.state_bytes of what the rank holds), `parameters()` and `gradients()` (every parameter, and the mean
gradient of the step just taken, gathered if sharded, in the GPT's `named_parameters()` order) and `layout()` (its
buckets, shard or units). `train` runs any of them and measures every step. The counterparts (YOURS): torch DDP for
the Reducer, ZeroRedundancyOptimizer over DDP for ZeRO-2 (ZeRO-1 in fact: the same AdamW arithmetic, other
collectives) and FSDP2 fully_shard for FlatShard. No gradient clipping: a sharded gradient needs one more all-reduce
for its norm (chapter 10, section 6), and the ledgers here must hold only what your component sends.
"""
import dataclasses
import hashlib
import time

import torch
import torch.distributed as dist

from capstone.data import get_batch
from capstone.model import GPT, GPTConfig
from helpers.backend import rank_device
from helpers.comm import CommLedger
from helpers.memory import state_bytes


@dataclasses.dataclass(frozen=True)
class CapstoneConfig:
    steps: int = 4
    batch_size: int = 2         # windows per rank per step
    block_size: int = 16
    n_layer: int = 1
    n_head: int = 2
    n_embd: int = 16
    lr: float = 1e-2
    weight_decay: float = 0.1
    betas: tuple = (0.9, 0.95)
    seed: int = 0
    bucket_cap_mb: float = 4 / 1024   # 4 KiB buckets: several per step for the Reducer (DDP gets the same cap)


def make_gpt(cfg, vocab_size):
    """The same GPT on every rank (seeded; ZeRO and FlatShard take no broadcast), on this rank's device."""
    torch.manual_seed(cfg.seed)
    config = GPTConfig(vocab_size, cfg.block_size, cfg.n_layer, cfg.n_head, cfg.n_embd)
    return GPT(config).to(rank_device())


def adamw(params, cfg):
    return torch.optim.AdamW(params, lr=cfg.lr, betas=cfg.betas, weight_decay=cfg.weight_decay)


def _flat(tensors):
    return torch.cat([t.detach().reshape(-1) for t in tensors]).cpu()


def _gather(shard):
    """Every rank's shard, one after the other (for checking and reporting, not for training)."""
    out = shard.new_empty(dist.get_world_size() * shard.numel())
    dist.all_gather_single(out, shard.detach())
    return out


class ReducerRun:
    """Your lab 04 Reducer (buckets all-reduced from the gradient hooks) and torch AdamW."""

    def __init__(self, gpt, cfg, Reducer):
        self.model, self.reducer = gpt, Reducer(gpt, cfg.bucket_cap_mb)   # broadcasts rank 0's, hooks every p
        self.optimizer = adamw(gpt.parameters(), cfg)

    def step(self, x, y):
        self.optimizer.zero_grad(set_to_none=True)
        _, loss = self.model(x, y)
        loss.backward()              # your hooks launch each bucket's all-reduce as it fills
        self.reducer.finalize()      # wait for them: every .grad is now the mean over ranks
        self.optimizer.step()
        return loss.detach()

    def state(self):
        return state_bytes(self.model, self.optimizer)

    def parameters(self):
        return _flat(self.model.parameters())

    def gradients(self):
        return _flat(p.grad for p in self.model.parameters())

    def layout(self):
        return {"buckets": len(self.reducer.buckets)}


class DDPRun(ReducerRun):
    """torch DistributedDataParallel with the same bucket cap, and torch AdamW."""

    def __init__(self, gpt, cfg):
        from torch.nn.parallel import DistributedDataParallel as DDP

        self.model = DDP(gpt, bucket_cap_mb=cfg.bucket_cap_mb)
        self.optimizer = adamw(gpt.parameters(), cfg)

    def step(self, x, y):
        self.optimizer.zero_grad(set_to_none=True)
        _, loss = self.model(x, y)
        loss.backward()              # DDP's C++ Reducer all-reduces its buckets in here
        self.optimizer.step()
        return loss.detach()

    def state(self):
        return state_bytes(self.model.module, self.optimizer)

    def parameters(self):
        return _flat(self.model.module.parameters())

    def gradients(self):
        return _flat(p.grad for p in self.model.module.parameters())

    def layout(self):
        return {}


class ZeRO2Run:
    """Your lab 07 ZeRO-2: one reduce-scatter of the padded flat gradient, AdamW on your shard, one all-gather."""

    def __init__(self, gpt, cfg, reduce_scatter_gradients, zero_adamw_step):
        self.model, self.cfg, self.params = gpt, cfg, list(gpt.parameters())
        self.reduce_scatter_gradients, self.zero_adamw_step = reduce_scatter_gradients, zero_adamw_step
        size = -(-sum(p.numel() for p in self.params) // dist.get_world_size())   # ceil(psi / N), as adam_state
        device = self.params[0].device
        self.adam = {"step": 0, "exp_avg": torch.zeros(size, device=device),
                     "exp_avg_sq": torch.zeros(size, device=device)}
        self.grad_shard = None

    def step(self, x, y):
        _, loss = self.model(x, y)
        loss.backward()
        self.grad_shard = self.reduce_scatter_gradients(self.params)   # frees every p.grad: ZeRO-2
        self.zero_adamw_step(self.params, self.grad_shard, self.adam, lr=self.cfg.lr,
                             weight_decay=self.cfg.weight_decay, betas=self.cfg.betas)
        return loss.detach()

    def state(self):
        # Between steps: the whole model, this rank's gradient shard and its shard of AdamW's moments.
        held = {"grads": [self.grad_shard] if self.grad_shard is not None else [],
                "optimizer": [self.adam["exp_avg"], self.adam["exp_avg_sq"]]}
        return state_bytes(self.model, extra=held)

    def parameters(self):
        return _flat(self.params)

    def gradients(self):
        return _gather(self.grad_shard)[:sum(p.numel() for p in self.params)].cpu()

    def layout(self):
        return {"shard": self.adam["exp_avg"].numel()}


class ZeroRedundancyRun(DDPRun):
    """torch ZeroRedundancyOptimizer(AdamW) over DDP: ZeRO-1, each rank steps the tensors it owns and broadcasts."""

    def __init__(self, gpt, cfg):
        from torch.distributed.optim import ZeroRedundancyOptimizer
        from torch.nn.parallel import DistributedDataParallel as DDP

        self.model = DDP(gpt, bucket_cap_mb=cfg.bucket_cap_mb)
        self.optimizer = ZeroRedundancyOptimizer(gpt.parameters(), optimizer_class=torch.optim.AdamW, lr=cfg.lr,
                                                 betas=cfg.betas, weight_decay=cfg.weight_decay)


class FlatShardRun:
    """Your lab 08 FlatShard: one unit per block, then the root (embeddings, final norm, the tied head), AdamW."""

    def __init__(self, gpt, cfg, FlatShard):
        self.numels = {name: p.numel() for name, p in gpt.named_parameters()}   # the GPT's order, tied weight once
        self.order = [[f"h.{i}.{name}" for name, _ in block.named_parameters()] for i, block in enumerate(gpt.h)]
        self.order.append([n for n in self.numels if not n.startswith("h.")])   # the root's, in the same order
        self.model = gpt
        tie_head_to_embedding(gpt)
        self.units = [FlatShard(block) for block in gpt.h] + [FlatShard(gpt)]   # bottom-up, the root last
        for unit, module in zip(self.units, [*gpt.h, gpt]):
            register_hooks(unit, module)
        self.optimizer = adamw(gpt.parameters(), cfg)                      # the shards: built after sharding

    def step(self, x, y):
        self.optimizer.zero_grad(set_to_none=True)
        _, loss = self.model(x, y)   # each unit gathered before its forward, freed after
        loss.backward()              # gathered again, its gradient reduce-scattered into flat_shard.grad
        self.optimizer.step()        # each rank steps its shards
        return loss.detach()

    def state(self):
        # "unsharded": bytes left in the units' full flat buffers between steps (0 once they are freed)
        return state_bytes(self.model, self.optimizer, extra={"unsharded": [unit.flat for unit in self.units]})

    def parameters(self):
        return self._gathered(lambda unit: unit.flat_shard.detach())

    def gradients(self):
        return self._gathered(lambda unit: unit.flat_shard.grad)

    def _gathered(self, shard_of):
        """Every unit's shards (shard_of(unit)) gathered, cut into the parameters, in the GPT's order."""
        full = {}
        for unit, names in zip(self.units, self.order):
            flat = _gather(shard_of(unit))[:unit.numel]
            full.update(zip(names, flat.split([self.numels[n] for n in names])))
        return _flat(full[name] for name in self.numels)

    def layout(self):
        return {"units": [[unit.numel, unit.flat_shard.numel()] for unit in self.units]}


class FullyShardRun(FlatShardRun):
    """FSDP2: fully_shard on every block, then on the root; each parameter a DTensor holding its shard; AdamW."""

    def __init__(self, gpt, cfg):
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        mesh = init_device_mesh(rank_device().type, (dist.get_world_size(),))
        for block in gpt.h:
            fully_shard(block, mesh=mesh)
        self.model = fully_shard(gpt, mesh=mesh)
        self.optimizer = adamw(gpt.parameters(), cfg)

    def state(self):
        return state_bytes(self.model, self.optimizer)

    def parameters(self):
        return _flat(p.full_tensor() for p in self.model.parameters())

    def gradients(self):
        return _flat(p.grad.full_tensor() for p in self.model.parameters())

    def layout(self):
        return {}


def tie_head_to_embedding(gpt):
    """The GPT's output layer shares the token embedding's tensor (weight tying). A unit flattens a tensor once,
    under its first name (wte.weight), and FlatShard's views go back only there: so the head's own reference is
    removed, and the head reads the embedding's gathered view at each forward instead."""
    del gpt.lm_head.weight
    gpt.lm_head.register_forward_pre_hook(lambda head, args: setattr(head, "weight", gpt.wte.weight))
    gpt.lm_head.register_forward_hook(lambda head, args, output: delattr(head, "weight"))   # no stale view


def register_hooks(unit, module):
    """Lab 08's four hooks, for a module whose output may be a tuple (the GPT returns (logits, loss))."""
    module.register_forward_pre_hook(lambda module, args: unit.unshard())
    module.register_forward_hook(lambda module, args, output: _post_forward(unit, output))
    unit.flat.register_post_accumulate_grad_hook(lambda flat: _post_backward(unit))


def _post_forward(unit, output):
    unit.reshard()
    first = output[0] if isinstance(output, tuple) else output
    if first.requires_grad:        # backward reaches this unit's output first: gather the unit again then
        first.register_hook(lambda grad: unit.unshard())


def _post_backward(unit):
    unit.reduce_scatter_grads()
    unit.reshard()


# kind -> (the run, what it is read against in helpers.theory). Yours take the component you bring.
RUNS = {"reducer": (ReducerRun, "ddp"), "ddp": (DDPRun, "ddp"),
        "zero2": (ZeRO2Run, "zero2"), "zero_redundancy": (ZeroRedundancyRun, "zero1"),
        "flatshard": (FlatShardRun, "zero3"), "fully_shard": (FullyShardRun, "zero3")}
YOURS = {"reducer": "ddp", "zero2": "zero_redundancy", "flatshard": "fully_shard"}   # yours -> PyTorch's


def make_run(kind, gpt, cfg, component=None):
    """The run of `kind` around gpt; yours (reducer, zero2, flatshard) take your component, PyTorch's none."""
    if kind not in RUNS:
        raise ValueError(f"kind={kind!r}: no such run; pass one of {sorted(RUNS)}")
    cls = RUNS[kind][0]
    if kind not in YOURS:
        return cls(gpt, cfg)
    if component is None:
        raise ValueError(f"kind={kind!r} trains with YOUR component: pass component= (what lab 10's bring "
                         f"function returns)")
    return cls(gpt, cfg, *component) if kind == "zero2" else cls(gpt, cfg, component)


def train(kind, data, cfg, component=None):
    """Run on every rank: cfg.steps steps of the run `kind` on this rank's batches; every step measured.

    Returns {"kind", "losses": the global batch's loss per step, "comm": per step {op: {calls, payload_bytes,
    wire_bytes}} (a helpers.comm.CommLedger around the step), "seconds": per step, on the slowest rank, "state":
    state_bytes after the last step, "params": every parameter at the end, "grads": the mean gradient of the first
    step (both gathered, in the GPT's order), "batches": a digest of this rank's batches, "layout": the run's
    buckets, shard or units}.
    """
    rank, world_size, device = dist.get_rank(), dist.get_world_size(), rank_device()
    run = make_run(kind, make_gpt(cfg, int(data.max()) + 1), cfg, component)
    losses, comm, seconds, digest = [], [], [], hashlib.sha256()
    for step in range(cfg.steps):
        x, y = get_batch(data, rank, world_size, step, cfg.batch_size, cfg.block_size, cfg.seed)
        digest.update(x.numpy().tobytes())
        x, y = x.to(device), y.to(device)
        start = time.perf_counter()
        with CommLedger() as ledger:
            losses.append(run.step(x, y))
        if device.type == "cuda":
            torch.cuda.synchronize()     # the host only queued the kernels
        seconds.append(time.perf_counter() - start)
        comm.append(ledger.totals())
        if step == 0:   # the first mean gradient: every run computes it at the same parameters
            grads = run.gradients()
    # After the loop, outside the ledgers: the global batch's loss, each step's time on its slowest rank.
    losses, seconds = torch.stack(losses), torch.tensor(seconds, device=device)
    dist.all_reduce(losses)
    dist.all_reduce(seconds, op=dist.ReduceOp.MAX)
    return {"kind": kind, "losses": (losses / world_size).tolist(), "comm": comm, "seconds": seconds.tolist(),
            "state": run.state(), "params": run.parameters(), "grads": grads,
            "batches": digest.hexdigest()[:16], "layout": run.layout()}
