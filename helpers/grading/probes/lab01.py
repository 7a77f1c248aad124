"""Hidden tests of lab 01 (gradient averaging). Public in this repository: see the README."""
from helpers.grading.probes import Probe

SETUP = '''
import torch as _probe_torch
import torch.distributed as _probe_dist
from helpers.grading.shared_run import launch_gloo as _probe_launch

def _probe_grads(seed, shapes):
    g = _probe_torch.Generator().manual_seed(_PROBE_SEED + seed)
    return [_probe_torch.randn(*s, generator=g) for s in shapes]

def _probe_token_rank(lengths):
    rank, n = _probe_dist.get_rank(), _probe_dist.get_world_size()
    _probe_torch.manual_seed(_PROBE_SEED + 0)
    w = _probe_torch.randn(4, requires_grad=True)
    x = _probe_torch.randn(n, 2, 5, 4)[rank]
    mask = _probe_torch.arange(5).expand(2, 5) < _probe_torch.tensor(lengths[rank]).view(2, 1)
    loss = global_token_mean_loss((x @ w).square(), mask)
    loss.backward()
    grad = w.grad.clone()
    _probe_dist.all_reduce(grad)
    return (grad / n).tolist()

def _probe_average_rank(sizes):
    rank = _probe_dist.get_rank()
    _probe_torch.manual_seed(_PROBE_SEED + 1)
    model = _probe_torch.nn.Linear(3, 2)
    data = _probe_torch.randn(sum(sizes), 3)
    start = sum(sizes[:rank])
    x = data[start:start + sizes[rank]]
    if sizes[rank]:
        model(x).square().mean().backward()
    average_gradients(model, sizes[rank])
    return [p.grad.clone() for p in model.parameters()]
'''

PROBES = [
    Probe("1.1", "three tensor shards of 3, 0 and 5 samples",
          "weighted_mean_grads(_probe_grads(7, [(6,), (6,), (6,)]), [3, 0, 5])"),
    Probe("1.1", "per-parameter lists, uneven counts",
          "weighted_mean_grads([_probe_grads(s, [(2, 3), (3,)]) for s in (1, 2)], [1, 9])"),
    Probe("1.2", "3 ranks with 7, 4 and 0 real tokens",
          "_probe_launch(_probe_token_rank, 3, args=([[5, 2], [3, 1], [0, 0]],), hang_timeout=10)", points=2),
    Probe("1.3", "3 ranks with 4, 1 and 6 samples: every rank's gradients",
          "_probe_launch(_probe_average_rank, 3, args=([4, 1, 6],), hang_timeout=10)", points=2),
    Probe("1.3", "2 ranks, one of them without samples",
          "_probe_launch(_probe_average_rank, 2, args=([0, 5],), hang_timeout=10)"),
]

# No question's probes call another question's answer (helpers/grading/reference.py).
USES = {}
