"""What you built in chapters 03 and 08, compact: a manual DDP and a manual FSDP (ZeRO-3).

ManualDDP (chapter 03): broadcast rank 0's parameters once (the GPT has no buffers); after backward,
all-reduce ONE flat buffer of every gradient and divide by the world size. Every rank keeps everything:
16 bytes per parameter with Adam in float32 (4 weight + 4 gradient + 8 optimizer state).

ManualFSDP (chapter 08, ZeRO-3): every unit (one per transformer block, plus the root for the embeddings,
the final norm and the tied output layer) is a FlatShard, as in chapter 08: its parameters flattened into
one vector, padded to a multiple of the world size N, of which the rank keeps only its 1/N shard. Around
the unit's forward the full vector is all-gathered, and freed after; backward gathers it again and
reduce-scatters the gradient into the shard.
Per step: all-gather + all-gather + reduce-scatter of every unit = 1.5x DDP's all-reduce traffic, for
about 16/N bytes of model state per parameter. (Chapter 08 also prefetched the next unit; we do not.)
"""
import torch
import torch.distributed as dist
import torch.nn as nn


class ManualDDP(nn.Module):
    """Chapter 03's data parallelism as a wrapper: same start, different data, same (averaged) gradient."""

    def __init__(self, module, src=0):
        super().__init__()
        self.module = module
        buffers = [name for name, _ in module.named_buffers()]
        if buffers:  # the GPT has none; lab 3.2 is the version that broadcasts buffers too
            raise ValueError(f"ManualDDP broadcasts parameters only, as chapter 03 does, and this module has buffers "
                             f"{buffers[:3]}: wrap it in torch DDP, or broadcast them as in lab 3.2")
        with torch.no_grad():                       # in place, outside autograd
            for p in module.parameters():
                dist.broadcast(p, src=src)

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def sync_gradients(self):
        """Call after backward, on every rank: every .grad becomes its mean over ranks (one all-reduce)."""
        params = [p for p in self.module.parameters() if p.requires_grad]
        flat = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in params])
        dist.all_reduce(flat)                       # sum over ranks ...
        flat /= dist.get_world_size()               # ... then the mean: the gradient of the global batch
        for p, g in zip(params, flat.split([p.numel() for p in params])):
            p.grad = g.view_as(p)


class FlatShard:
    """Chapter 08's FlatShard, for a whole subtree: the parameters `module` owns (not those of inner units)."""

    def __init__(self, module, prefix, claimed):
        rank, n = dist.get_rank(), dist.get_world_size()
        self.slots, tensors = own_parameters(module, prefix, claimed)
        self.numel = sum(t.numel() for t in tensors)                  # Psi_u
        self.padded_numel = -(-self.numel // n) * n                   # ceil(Psi_u / N) * N: equal shards
        flat = torch.cat([t.reshape(-1) for t in tensors])
        flat = torch.cat([flat, flat.new_zeros(self.padded_numel - self.numel)])   # zeros at the end
        dist.broadcast(flat, src=0)                                   # same start (FSDP1's sync_module_states)
        shard = self.padded_numel // n
        self.flat_shard = nn.Parameter(flat[rank * shard:(rank + 1) * shard].clone())   # the only copy kept
        for mod, name, *_ in self.slots:
            mod._parameters.pop(name, None)                           # the module forgets its parameters ...
        module.register_parameter("flat_shard", self.flat_shard)     # ... and holds this rank's shard instead
        claimed.add(id(self.flat_shard))
        self.flat = torch.zeros_like(flat, requires_grad=True)        # the full vector: an autograd leaf
        self.flat.register_post_accumulate_grad_hook(lambda flat: self.post_backward())
        self.reshard()
        module.register_forward_pre_hook(lambda module, args: self.pre_forward())
        module.register_forward_hook(lambda module, args, output: self.post_forward(output))

    def unshard(self):
        """All-gather the full flat vector into its storage (the same storage every time)."""
        self.flat.untyped_storage().resize_(self.padded_numel * self.flat.element_size())
        dist.all_gather_single(self.flat.data, self.flat_shard.data)   # .data: no version bump for autograd

    def reshard(self):
        """Free the full vector: its storage shrinks to 0 bytes; views and saved tensors keep pointing at it."""
        self.flat.untyped_storage().resize_(0)

    def pre_forward(self):
        self.unshard()
        for mod, name, _, offset, shape in self.slots:   # module.weight := a view of flat, made with autograd
            setattr(mod, name, self.flat[offset:offset + shape.numel()].view(shape))

    def post_forward(self, output):
        self.reshard()
        first = output[0] if isinstance(output, tuple) else output   # the GPT returns (logits, loss)
        if first.requires_grad:                   # backward will reach this unit: gather it again first
            first.register_hook(lambda grad: self.pre_backward())
        return output

    def pre_backward(self):
        if self.flat.untyped_storage().nbytes() == 0:
            self.unshard()

    def post_backward(self):
        """flat.grad is complete: reduce-scatter its mean over ranks into this rank's shard, free the rest."""
        shard_grad = torch.empty_like(self.flat_shard)
        dist.reduce_scatter_single(shard_grad, self.flat.grad.div_(dist.get_world_size()))
        self.flat_shard.grad = shard_grad if self.flat_shard.grad is None else self.flat_shard.grad + shard_grad
        self.flat.grad = None
        self.reshard()

    def full_parameters(self):
        """{name: full tensor}: all-gather the shards (for checking and saving, not for training)."""
        flat = self.flat_shard.new_empty(self.padded_numel)              # the shard's dtype and device
        dist.all_gather_single(flat, self.flat_shard.data)
        return {name: flat[offset:offset + shape.numel()].view(shape).clone()
                for _, _, name, offset, shape in self.slots}


def own_parameters(module, prefix, claimed):
    """(slots, tensors): the parameters in module's subtree not claimed by an inner unit; a tied one stored once.

    A slot (owner module, attribute, full name, offset in the flat vector, shape) says where a view goes."""
    slots, tensors, offsets = [], [], {}
    for mod_name, mod in module.named_modules(prefix=prefix):
        for name, p in mod._parameters.items():
            if p is None or id(p) in claimed:
                continue
            if id(p) not in offsets:
                offsets[id(p)] = sum(t.numel() for t in tensors)
                tensors.append(p.detach())
            slots.append((mod, name, f"{mod_name}.{name}".lstrip("."), offsets[id(p)], p.shape))
    claimed.update(offsets)
    return slots, tensors


class ManualFSDP(nn.Module):
    """Chapter 08's ZeRO-3 as a wrapper: one FlatShard per module in `units` (innermost first), then the root."""

    def __init__(self, module, units):
        super().__init__()
        self.module, claimed = module, set()
        self.names = [name for name, _ in module.named_parameters()]   # the model's order, tied weights once
        prefixes = {id(m): name for name, m in module.named_modules()}
        self.units = [FlatShard(m, prefixes[id(m)], claimed) for m in [*units, module]]

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def full_parameters(self):
        """{name: full tensor} in the unwrapped model's parameter order."""
        gathered = {name: t for unit in self.units for name, t in unit.full_parameters().items()}
        return {name: gathered[name] for name in self.names}


def clip_grad_norm_sharded(shards, max_norm):
    """clip_grad_norm_ when every rank holds a shard of each gradient: the norm is over ALL shards."""
    local = torch.stack([p.grad.float().square().sum() for p in shards]).sum()
    dist.all_reduce(local)                          # sum of squares over every shard of every rank
    total_norm = local.sqrt()
    coef = torch.clamp(max_norm / (total_norm + 1e-6), max=1.0)
    for p in shards:
        p.grad.mul_(coef)
    return total_norm
