"""Hidden tests of lab 06: the formulas on inputs the public checks do not use, and a 3-rank and a 2-rank replica."""
import dataclasses

from helpers.grading.probes import Probe

SETUP = '''
import torch as _probe_torch
import torch.distributed as _probe_dist
from helpers.grading.shared_run import launch_gloo as _probe_launch
# Inputs scale with the question's secret seed: an output memorised for one call is worth nothing.
_probe_s = 1 + (_PROBE_SEED % 997) / 997


def _probe_replica(train_replica, seed, steps, lr):
    rank = _probe_dist.get_rank()
    _probe_torch.manual_seed(_PROBE_SEED + seed + rank)
    model = _probe_torch.nn.Sequential(_probe_torch.nn.Linear(5, 7), _probe_torch.nn.ReLU(),
                                       _probe_torch.nn.Linear(7, 2))
    g = _probe_torch.Generator().manual_seed(_PROBE_SEED + seed + 100 + rank)
    X, Y = _probe_torch.randn(6, 5, generator=g), _probe_torch.randn(6, 2, generator=g)
    counts = train_replica(model, X, Y, steps=steps, lr=lr)
    flat = _probe_torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    return flat, {k: int(counts[k]) for k in ("params", "grads", "optimizer")}


def _probe_run_replica(train_replica, world_size, seed, steps, lr):
    """[parameters of every rank (world_size x 58), rank 0's model-state bytes]."""
    results = _probe_launch(_probe_replica, world_size, args=(train_replica, seed, steps, lr), backend="gloo",
                            hang_timeout=10)
    return [_probe_torch.stack([flat for flat, _ in results]), results[0][1]]
'''

PROBES = [
    # 6.1: odd world sizes and non-default conventions
    Probe("6.1", "ZeRO-2 on 5 devices, fp32 gradients",
          "model_state_bytes(3.3e9 * _probe_s, 5, 2, param_bytes=2, grad_bytes=4, optimizer_bytes=12)"),
    Probe("6.1", "every stage on 7 devices, fp32 Adam",
          "[model_state_bytes(1e9 * _probe_s, 7, s, param_bytes=4, grad_bytes=4, optimizer_bytes=8) "
          "for s in range(4)]"),
    Probe("6.1", "every stage on one device",
          "[model_state_bytes(123_456_789 + _PROBE_SEED, 1, s) for s in range(4)]"),
    Probe("6.1", "SGD with momentum, ZeRO-1 on 3 devices",
          "model_state_bytes(2.5e10 * _probe_s, 3, 1, param_bytes=2, grad_bytes=2, optimizer_bytes=8)"),
    # 6.2
    Probe("6.2", "80 GB, ZeRO-3 on 8 devices", "largest_model(80e9 * _probe_s, 8, 3)"),
    Probe("6.2", "24 GB with 4 GB reserved, ZeRO-2 on 3 devices, fp32 gradients",
          "largest_model(24e9 * _probe_s, 3, 2, reserved_bytes=4e9, param_bytes=2, grad_bytes=4, optimizer_bytes=12)"),
    Probe("6.2", "40 GB, ZeRO-1 on 7 devices, fp32 Adam",
          "largest_model(40e9 * _probe_s, 7, 1, param_bytes=4, grad_bytes=4, optimizer_bytes=8)"),
    Probe("6.2", "nothing fits",
          "[largest_model(1e9 * _probe_s, 1, 0, reserved_bytes=2e9 * _probe_s), "
          "largest_model(1e9 * _probe_s, 1, 0)]"),
    # 6.3
    Probe("6.3", "one GELU block, odd sizes", "activation_bytes(3 + _PROBE_SEED % 4, 7, 12, 3, 20)"),
    Probe("6.3", "two ReLU blocks",
          "activation_bytes(2 + _PROBE_SEED % 3, 9, 16, 4, 24, n_layers=2, activation='relu')"),
    Probe("6.3", "GPT-2 small, 12 layers", "activation_bytes(8 + _PROBE_SEED % 4, 1024, 768, 12, 3072, n_layers=12)"),
    # 6.4: multi-rank, an odd and an even world size
    Probe("6.4", "3 ranks: parameters of every rank and model-state bytes",
          "_probe_run_replica(train_replica, 3, 7, 4, 0.05)", points=2),
    Probe("6.4", "2 ranks: parameters of every rank and model-state bytes",
          "_probe_run_replica(train_replica, 2, 11, 3, 0.02)"),
]

# Using the course's own formulas scores 0 on the questions that rebuild it.
_FORBIDDEN = ("helpers.theory", "helpers.theory_comm", "helpers.widgets")
PROBES = [dataclasses.replace(p, forbidden=_FORBIDDEN) if p.question in ('6.1', '6.2', '6.3') else p for p in PROBES]

# The earlier answers each question's probes call, directly or through other answers, graded with the
# solution's versions bound in their place (helpers/grading/reference.py): largest_model searches with
# model_state_bytes.
USES = {'6.2': ('6.1',)}
