"""Hidden tests of lab 02 (collectives, ring all-reduce). Public in this repository: see the README."""
import dataclasses

from helpers.grading.probes import Probe

SETUP = '''
import torch as _probe_torch
import torch.distributed as _probe_dist
from helpers import launch as _probe_launch

def _probe_mine(numel, dtype=_probe_torch.float32):
    g = _probe_torch.Generator().manual_seed(_PROBE_SEED + 100 + _probe_dist.get_rank())
    return (_probe_torch.randn(numel, generator=g) * 10).to(dtype)

def _probe_exchange():
    left, right = exchange_with_neighbours(_probe_torch.tensor([10.0 * _probe_dist.get_rank() + 1 + _PROBE_SEED % 997]))
    return [left, right]

def _probe_reduce_scatter(numel):
    return ring_reduce_scatter(_probe_mine(numel))

def _probe_all_gather(numel):
    rank, n = _probe_dist.get_rank(), _probe_dist.get_world_size()
    return ring_all_gather(_probe_torch.tensor_split(_probe_mine(numel), n)[rank].clone(), numel)

def _probe_all_reduce(shape, dtype):
    t = _probe_mine(int(_probe_torch.tensor(shape).prod()), dtype).reshape(shape)
    out = ring_all_reduce(t)
    return [out, t]

def _probe_average():
    _probe_torch.manual_seed(_PROBE_SEED + 3)
    model = _probe_torch.nn.Sequential(_probe_torch.nn.Linear(4, 3), _probe_torch.nn.Linear(3, 1))
    model(_probe_mine(8).view(2, 4)).square().mean().backward()
    average_gradients(model)
    return [p.grad for p in model.parameters()]
'''

PROBES = [
    Probe("2.1", "3 ranks", "_probe_launch(_probe_exchange, 3, hang_timeout=10)"),
    Probe("2.1", "4 ranks", "_probe_launch(_probe_exchange, 4, hang_timeout=10)"),
    Probe("2.2", "3 ranks, 8 elements", "_probe_launch(_probe_reduce_scatter, 3, args=(8,), hang_timeout=10)"),
    Probe("2.2", "4 ranks, 2 elements", "_probe_launch(_probe_reduce_scatter, 4, args=(2,), hang_timeout=10)"),
    Probe("2.3", "3 ranks, 10 elements", "_probe_launch(_probe_all_gather, 3, args=(10,), hang_timeout=10)"),
    Probe("2.4", "3 ranks, float32 (2, 5)",
          "_probe_launch(_probe_all_reduce, 3, args=((2, 5), _probe_torch.float32), hang_timeout=10)", points=2),
    Probe("2.4", "4 ranks, int64 of 3 elements",
          "_probe_launch(_probe_all_reduce, 4, args=((3,), _probe_torch.int64), hang_timeout=10)"),
    Probe("2.5", "3 ranks, a two-layer model", "_probe_launch(_probe_average, 3, hang_timeout=10)", points=2),
]

# Using the collectives the ring rebuilds from send and recv scores 0 on the questions that rebuild it.
_FORBIDDEN = ("all_reduce", "reduce_scatter", "reduce_scatter_tensor", "reduce_scatter_single", "_reduce_scatter_base", "all_gather", "all_gather_into_tensor", "all_gather_single", "_all_gather_base", "all_to_all", "all_to_all_single", "broadcast")
PROBES = [dataclasses.replace(p, forbidden=_FORBIDDEN) if p.question in ('2.1', '2.2', '2.3', '2.4', '2.5') else p for p in PROBES]
