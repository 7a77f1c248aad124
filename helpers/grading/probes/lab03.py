"""Hidden tests of lab 03 (manual DDP). Public in this repository: see the README."""
from helpers.grading.probes import Probe

SETUP = '''
import torch as _probe_torch
import torch.distributed as _probe_dist
from helpers import launch as _probe_launch

def _probe_broadcast(src):
    _probe_torch.manual_seed(10 + _probe_dist.get_rank())
    model = _probe_torch.nn.Sequential(_probe_torch.nn.Linear(3, 4), _probe_torch.nn.BatchNorm1d(4))
    model[1].running_mean += _probe_dist.get_rank()
    broadcast_parameters(model, src=src)
    return {k: v for k, v in model.state_dict().items()}

def _probe_average():
    _probe_torch.manual_seed(4)
    model = _probe_torch.nn.Sequential(_probe_torch.nn.Linear(3, 4), _probe_torch.nn.Linear(4, 2))
    model[0].bias.requires_grad_(False)
    x = _probe_torch.randn(3, 5, 3)[_probe_dist.get_rank()]
    model(x).square().mean().backward()
    average_gradients(model)
    return [p.grad for p in model.parameters()]

def _probe_train():
    _probe_torch.manual_seed(20 + _probe_dist.get_rank())   # different init on every rank
    model = _probe_torch.nn.Sequential(_probe_torch.nn.Linear(3, 4), _probe_torch.nn.Tanh(), _probe_torch.nn.Linear(4, 1))
    g = _probe_torch.Generator().manual_seed(5)
    X, Y = _probe_torch.randn(23, 3, generator=g), _probe_torch.randn(23, 1, generator=g)
    losses = train_manual_ddp(model, X, Y, epochs=2, batch_size=3, lr=0.05, seed=9)
    return {"losses": losses, "params": [p.detach() for p in model.parameters()]}
'''

PROBES = [
    Probe("3.1", "11 samples, rank 2 of 3, shuffled, epoch 3",
          "shard_indices(11, 2, 3, shuffle=True, seed=5, epoch=3, drop_last=False)"),
    Probe("3.1", "2 samples on 5 ranks (padding wraps)",
          "[shard_indices(2, r, 5, shuffle=False, seed=0, epoch=0, drop_last=False) for r in range(5)]"),
    Probe("3.1", "10 samples, 4 ranks, drop_last",
          "[shard_indices(10, r, 4, shuffle=True, seed=1, epoch=0, drop_last=True) for r in range(4)]"),
    Probe("3.2", "3 ranks, from rank 1, with a BatchNorm buffer",
          "_probe_launch(_probe_broadcast, 3, args=(1,), hang_timeout=10)", points=2),
    Probe("3.3", "3 ranks, a frozen bias", "_probe_launch(_probe_average, 3, hang_timeout=10)", points=2),
    Probe("3.4", "3 ranks, 23 samples, 2 epochs", "_probe_launch(_probe_train, 3, hang_timeout=20)", points=3),
]
