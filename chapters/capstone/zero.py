"""What you built in chapter 07, in the shape of the real APIs: a ZeRO-1/2 optimizer that wraps any torch.optim class.

    optimizer = ShardedOptimizer(model.parameters(), torch.optim.AdamW, lr=1e-3, weight_decay=0.1)

As torch.distributed.optim.ZeroRedundancyOptimizer (and CS336's sharded optimizer) do, each rank OWNS whole parameter
tensors, and a local `optimizer_cls` (`self.optim`) holds the state of the owned ones only: about 1/N of it.
Chapter 07 cut one flat parameter into equal pieces instead; whole tensors let ANY optimizer run unchanged (SGD's
momentum, AdamW's weight decay, a per-tensor norm), at the price of uneven shards when one tensor is big.

Ownership is ZeroRedundancyOptimizer's sorted-greedy rule (torch/distributed/optim/zero_redundancy_optimizer.py,
`_partition_parameters`): group by group, largest tensor first, each tensor goes to the rank with the fewest elements
so far (ties: the lowest rank). The loads carry over from group to group, and `add_param_group` places only the new
tensors, so the old ones keep their owner and their state.

One step, per rank (N ranks, psi elements):

    stage   gradients before step()                       step()                          sent (ring, per rank)
    ZeRO-1  averaged by DDP's all-reduce (2 psi)          update owned, broadcast them    2 psi + psi = 1.5x DDP
    ZeRO-2  reduce_gradients(): each tensor's mean is     update owned, broadcast them    psi + psi   = DDP's
            reduced to its owner; others drop .grad

ZeroRedundancyOptimizer is the ZeRO-1 row. The ZeRO-2 row is chapter 07's reduce-scatter + all-gather done tensor by
tensor: a `reduce` to the owner instead of a reduce-scatter, a `broadcast` from the owner instead of an all-gather.
"""
import torch
import torch.distributed as dist


class ShardedOptimizer(torch.optim.Optimizer):
    """ZeRO-1/2: `optimizer_cls(**kwargs)` steps only the parameters this rank owns; step() broadcasts them."""

    def __init__(self, params, optimizer_cls, **kwargs):
        if not (isinstance(optimizer_cls, type) and issubclass(optimizer_cls, torch.optim.Optimizer)):
            named = isinstance(optimizer_cls, (str, type))
            got = repr(optimizer_cls) if named else f"an {type(optimizer_cls).__name__}"
            raise TypeError(f"optimizer_cls is {got}, not an optimizer class: pass the class itself, "
                            f"a subclass of torch.optim.Optimizer such as torch.optim.AdamW, and its arguments as "
                            f"keywords: ShardedOptimizer(params, torch.optim.AdamW, lr=1e-3)")
        if not dist.is_initialized():
            raise RuntimeError("ShardedOptimizer shards over the ranks of the default process group, and there is "
                               "none: call dist.init_process_group first (or run the code under helpers.launch)")
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        self.owner, self.loads = {}, [0] * self.world_size    # parameter -> rank; elements owned per rank
        self.optim, local_groups = None, []
        self._pending = local_groups                          # the base constructor calls add_param_group
        super().__init__(params, kwargs)                      # fills self.param_groups: ALL the parameters
        del self._pending
        self.optim = optimizer_cls(local_groups, **kwargs)    # only this rank's parameters, group by group
        self.state = self.optim.state                         # one state, the local one: nothing kept twice
        self._copy_hyperparameters(self.optim.param_groups, self.param_groups)   # the class's defaults, shown

    def add_param_group(self, param_group):
        """Add a group on EVERY rank (as for ZeroRedundancyOptimizer): its tensors get owners, the local optimizer
        gets the owned ones (possibly none: an empty group keeps the group indices of all ranks aligned)."""
        super().add_param_group(param_group)                  # checks and defaults, as any optimizer
        group = self.param_groups[-1]
        for p in sorted(group["params"], key=lambda t: t.numel(), reverse=True):   # stable: ties keep their order
            rank = self.loads.index(min(self.loads))
            self.owner[p] = rank
            self.loads[rank] += p.numel()
        local = self._local_group(group)
        if self.optim is None:
            self._pending.append(local)
        else:
            self.optim.add_param_group(local)
            self._copy_hyperparameters(self.optim.param_groups, self.param_groups)

    def _local_group(self, group):
        """The group with only this rank's tensors (and their names, if the group has names)."""
        mine = [i for i, p in enumerate(group["params"]) if self.owner[p] == self.rank]
        local = {**group, "params": [group["params"][i] for i in mine]}
        if "param_names" in group:
            local["param_names"] = [group["param_names"][i] for i in mine]
        return local

    @torch.no_grad()
    def reduce_gradients(self):
        """ZeRO-2, after backward on every rank: each gradient's mean goes to its owner only; the others drop it."""
        handles = [dist.reduce(p.grad, dst=self.owner[p], async_op=True) for p in self._params() if p.grad is not None]
        for handle in handles:
            handle.wait()
        for p in self._params():
            if self.owner[p] != self.rank:
                p.grad = None                                 # this rank will never read it: free it now
            elif p.grad is not None:
                p.grad /= self.world_size                     # the sum over ranks -> the mean

    def step(self, closure=None, **kwargs):
        """The local optimizer's step on the owned tensors, then every tensor is broadcast from its owner."""
        self._copy_hyperparameters(self.param_groups, self.optim.param_groups)   # an LR scheduler sets ours
        loss = self.optim.step(closure, **kwargs) if closure is not None else self.optim.step(**kwargs)
        self._broadcast_parameters()
        return loss

    def state_dict(self):
        """This rank's shard: the local optimizer's state dict (ZeroRedundancyOptimizer's local one, before any
        consolidate_state_dict). Save one per rank; load it on the same rank, with the same groups."""
        return self.optim.state_dict()

    def load_state_dict(self, state_dict):
        """Load this rank's shard. The inherited method would replace self.state and lose the local optimizer's."""
        self.optim.load_state_dict(state_dict)
        self.state = self.optim.state
        self._copy_hyperparameters(self.optim.param_groups, self.param_groups)

    @torch.no_grad()
    def _broadcast_parameters(self):
        handles = [dist.broadcast(p.data, src=self.owner[p], async_op=True) for p in self._params()]
        for handle in handles:
            handle.wait()

    def _params(self):
        return [p for group in self.param_groups for p in group["params"]]

    @staticmethod
    def _copy_hyperparameters(source_groups, target_groups):
        for source, target in zip(source_groups, target_groups, strict=True):
            target.update({k: v for k, v in source.items() if k not in ("params", "param_names")})
