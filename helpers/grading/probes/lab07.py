"""Hidden tests of lab 07 (ZeRO-1 and ZeRO-2). Public in this repository: see the README."""
import dataclasses

from helpers.grading.probes import Probe

SETUP = '''
import math as _probe_math
import torch as _probe_torch
import torch.distributed as _probe_dist
from helpers.grading.shared_run import launch_gloo as _probe_launch
from helpers.comm import CommLedger as _probe_Ledger

def _probe_params(sizes, seed):
    g = _probe_torch.Generator().manual_seed(_PROBE_SEED + seed)
    return [_probe_torch.nn.Parameter(0.3 * _probe_torch.randn(n, generator=g)) for n in sizes]

def _probe_step(sizes, lr, weight_decay, steps):
    rank, n = _probe_dist.get_rank(), _probe_dist.get_world_size()
    params = _probe_params(sizes, 11)
    numel = sum(sizes)
    s = _probe_math.ceil(numel / n)
    state = {"step": 0, "exp_avg": _probe_torch.zeros(s), "exp_avg_sq": _probe_torch.zeros(s)}
    for step in range(steps):
        g = _probe_torch.randn(s * n, generator=_probe_torch.Generator().manual_seed(_PROBE_SEED + 60 + step))
        g[numel:] = 0                                   # the padding's gradient is zero
        zero_adamw_step(params, g.view(n, s)[rank].clone(), state, lr=lr, weight_decay=weight_decay)
    return {"params": [p.detach() for p in params], "exp_avg": state["exp_avg"],
            "exp_avg_sq": state["exp_avg_sq"], "step": state["step"]}

def _probe_reduce(none_rank):
    rank = _probe_dist.get_rank()
    params = _probe_params((7, 3, 5), 12)
    g = _probe_torch.Generator().manual_seed(_PROBE_SEED + 70 + rank)
    for p in params:
        p.grad = _probe_torch.randn(p.shape, generator=g)
    if rank == none_rank:
        params[1].grad = None                           # unused on this rank: counts as zeros
    shard = reduce_scatter_gradients(params)
    return {"shard": shard, "freed": all(p.grad is None for p in params)}

def _probe_train(steps):
    rank = _probe_dist.get_rank()
    _probe_torch.manual_seed(_PROBE_SEED + 8)
    nn = _probe_torch.nn
    model = nn.Sequential(nn.Linear(4, 6), nn.Tanh(), nn.Linear(6, 3), nn.Tanh(), nn.Linear(3, 1))
    model[2].requires_grad_(False)                      # a frozen middle layer
    g = _probe_torch.Generator().manual_seed(_PROBE_SEED + 80 + rank)
    xs = [_probe_torch.randn(2 + rank, 4, generator=g) for _ in range(steps)]
    batches = [(x, _probe_torch.sin(x.sum(dim=1, keepdim=True))) for x in xs]
    with _probe_Ledger() as ledger:
        state = train_zero2(model, batches, lr=0.03, weight_decay=0.05)
    return {"params": [p.detach() for p in model.parameters()], "ops": [r.op for r in ledger.records],
            "exp_avg": state["exp_avg"]}

def _probe_optimizer(steps):
    """ZeroAdamW over two groups (a frozen tensor in one), the lr changed through param_groups after one step."""
    rank = _probe_dist.get_rank()
    _probe_torch.manual_seed(_PROBE_SEED + 9)
    nn = _probe_torch.nn
    model = nn.Sequential(nn.Linear(3, 5), nn.Tanh(), nn.Linear(5, 2))
    model[2].bias.requires_grad_(False)
    groups = [{"params": [model[0].weight, model[2].weight], "weight_decay": 0.05},
              {"params": [model[0].bias, model[2].bias], "lr": 0.02, "weight_decay": 0.0}]
    optimizer = ZeroAdamW(groups, lr=0.01, betas=(0.85, 0.99))
    g = _probe_torch.Generator().manual_seed(_PROBE_SEED + 90 + rank)
    with _probe_Ledger() as ledger:
        for step in range(steps):
            if step == 1:
                for group in optimizer.param_groups:
                    group["lr"] *= 0.3
            x = _probe_torch.randn(3, 3, generator=g)
            optimizer.zero_grad()
            _probe_torch.nn.functional.mse_loss(model(x), _probe_torch.sin(x[:, :2])).backward()
            optimizer.step()
    state = [t.numel() for value in optimizer.state.values() for t in value.values()
             if isinstance(t, _probe_torch.Tensor)]
    return {"params": [p.detach() for p in model.parameters()], "ops": [r.op for r in ledger.records],
            "groups": [[group[k] for k in ("lr", "betas", "eps", "weight_decay")] for group in optimizer.param_groups],
            "state_elements": sorted(state)}
'''

PROBES = [
    Probe("7.1", "17-23 elements on 5 ranks", "[list(shard_range(17 + _PROBE_SEED % 7, r, 5)) for r in range(5)]"),
    Probe("7.1", "fewer elements than ranks, 4 to 8 ranks (ranks with only padding)",
          "[list(shard_range(1 + _PROBE_SEED // 5 % (3 + _PROBE_SEED % 5), r, 4 + _PROBE_SEED % 5)) "
          "for r in range(4 + _PROBE_SEED % 5)]"),
    Probe("7.1", "100-149 elements on 7 ranks, and 1 element on 1 rank",
          "[list(shard_range(100 + _PROBE_SEED % 50, r, 7)) for r in range(7)] + [list(shard_range(1, 0, 1))]"),
    Probe("7.2", "2 ranks, 13 parameters, 3 steps",
          "_probe_launch(_probe_step, 2, args=((6, 7), 0.05, 0.1, 3), hang_timeout=10)", points=2),
    Probe("7.2", "3 ranks, 11 parameters, no weight decay",
          "_probe_launch(_probe_step, 3, args=((4, 4, 3), 0.1, 0.0, 2), hang_timeout=10)", points=2),
    Probe("7.2", "4 ranks, 9 parameters (rank 3 holds only padding)",
          "_probe_launch(_probe_step, 4, args=((5, 4), 0.02, 0.2, 3), hang_timeout=10)", points=2),
    Probe("7.3", "4 ranks, a missing gradient on rank 0", "_probe_launch(_probe_reduce, 4, args=(0,), hang_timeout=10)",
          points=2),
    Probe("7.3", "3 ranks, a missing gradient on rank 2", "_probe_launch(_probe_reduce, 3, args=(2,), hang_timeout=10)",
          points=2),
    Probe("7.4", "3 ranks, a frozen middle layer, 3 steps",
          "_probe_launch(_probe_train, 3, args=(3,), hang_timeout=20)",
          points=3),
    Probe("7.4", "2 ranks, 2 steps", "_probe_launch(_probe_train, 2, args=(2,), hang_timeout=20)", points=2),
    Probe("7.5", "4 ranks, two groups, the lr changed after one step (rank 3 holds only padding of a group)",
          "_probe_launch(_probe_optimizer, 4, args=(3,), hang_timeout=20)", points=2),
    Probe("7.5", "2 ranks, two groups, 2 steps", "_probe_launch(_probe_optimizer, 2, args=(2,), hang_timeout=20)"),
]

# Using PyTorch's ZeRO scores 0 on the questions that rebuild it; 7.5 wraps the 7.2 step, not torch's Adam.
_FORBIDDEN = ("ZeroRedundancyOptimizer",)
_FORBIDDEN_7_5 = _FORBIDDEN + ("Adam", "AdamW", "adam", "adamw")
PROBES = [dataclasses.replace(p, forbidden=_FORBIDDEN_7_5 if p.question == "7.5" else _FORBIDDEN) for p in PROBES]

# The earlier answers each question's probes call, directly or through other answers, graded with the
# solution's versions bound in their place (helpers/grading/reference.py): zero_adamw_step cuts its shard with
# shard_range; train_zero2 and ZeroAdamW call 7.2 and 7.3.
USES = {'7.2': ('7.1',), '7.4': ('7.1', '7.2', '7.3'), '7.5': ('7.1', '7.2', '7.3')}
