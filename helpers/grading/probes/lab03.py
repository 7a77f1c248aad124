"""Hidden tests of lab 03 (manual DDP). Public in this repository: see the README."""
from helpers.grading.probes import Probe

SETUP = '''
import torch as _probe_torch
import torch.distributed as _probe_dist
from helpers.grading.shared_run import launch_gloo as _probe_launch
from helpers.comm import CommLedger as _probe_Ledger

def _probe_broadcast(src):
    _probe_torch.manual_seed(_PROBE_SEED + 10 + _probe_dist.get_rank())
    model = _probe_torch.nn.Sequential(_probe_torch.nn.Linear(3, 4), _probe_torch.nn.BatchNorm1d(4))
    model[1].running_mean += _probe_dist.get_rank()
    broadcast_parameters(model, src=src)
    return {k: v for k, v in model.state_dict().items()}

def _probe_average():
    _probe_torch.manual_seed(_PROBE_SEED + 4)
    model = _probe_torch.nn.Sequential(_probe_torch.nn.Linear(3, 4), _probe_torch.nn.Linear(4, 2))
    model[0].bias.requires_grad_(False)
    x = _probe_torch.randn(3, 5, 3)[_probe_dist.get_rank()]
    model(x).square().mean().backward()
    with _probe_Ledger() as ledger:                          # the lab asks for ONE all_reduce
        average_gradients(model)
    calls = {op: [t["calls"], t["payload_bytes"]] for op, t in ledger.totals().items()}
    return {"grads": [p.grad for p in model.parameters()], "collectives": calls}

def _probe_train():
    _probe_torch.manual_seed(_PROBE_SEED + 20 + _probe_dist.get_rank())   # different init on every rank
    nn = _probe_torch.nn
    model = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 1))
    g = _probe_torch.Generator().manual_seed(_PROBE_SEED + 5)
    X, Y = _probe_torch.randn(23, 3, generator=g), _probe_torch.randn(23, 1, generator=g)
    losses = train_manual_ddp(model, X, Y, epochs=2, batch_size=3, lr=0.05, seed=9)
    return {"losses": losses, "params": [p.detach() for p in model.parameters()]}
'''

# What 3.1 rebuilds (DistributedSampler) and what 3.2-3.4 rebuild (DistributedDataParallel).
_SAMPLER, _DDP = ("DistributedSampler",), ("DistributedDataParallel",)

PROBES = [
    # Sizes and seeds come from the question's secret seed: outputs memorised for one call are worth nothing.
    Probe("3.1", "11-15 samples, rank 2 of 3, shuffled, epoch 3",
          "shard_indices(11 + _PROBE_SEED % 5, 2, 3, shuffle=True, seed=_PROBE_SEED, epoch=3, drop_last=False)",
          forbidden=_SAMPLER),
    Probe("3.1", "2-4 samples on 5 ranks (padding wraps)",
          "[shard_indices(2 + _PROBE_SEED % 3, r, 5, shuffle=True, seed=_PROBE_SEED, epoch=0, drop_last=False) "
          "for r in range(5)]", forbidden=_SAMPLER),
    Probe("3.1", "10-12 samples, 4 ranks, drop_last",
          "[shard_indices(10 + _PROBE_SEED % 3, r, 4, shuffle=True, seed=_PROBE_SEED, epoch=1, drop_last=True) "
          "for r in range(4)]", forbidden=_SAMPLER),
    Probe("3.2", "3 ranks, from rank 1, with a BatchNorm buffer",
          "_probe_launch(_probe_broadcast, 3, args=(1,), hang_timeout=10)", points=2, forbidden=_DDP),
    Probe("3.3", "3 ranks, a frozen bias: the mean gradients, with one all_reduce of the trainable ones",
          "_probe_launch(_probe_average, 3, hang_timeout=10)", points=2, forbidden=_DDP),
    Probe("3.4", "3 ranks, 23 samples, 2 epochs", "_probe_launch(_probe_train, 3, hang_timeout=20)", points=3,
          forbidden=_DDP),
]

# The earlier answers each question's probes call, directly or through other answers, graded with the
# solution's versions bound in their place (helpers/grading/reference.py): train_manual_ddp calls shard_indices,
# broadcast_parameters and average_gradients.
USES = {'3.4': ('3.1', '3.2', '3.3')}
