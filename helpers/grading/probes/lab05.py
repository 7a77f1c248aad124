"""Hidden tests of lab 05 (accumulation with no_sync, a step-time simulator). Public in this repository: see the
README."""
from helpers.grading.probes import Probe

SETUP = '''
import torch as _probe_torch
import torch.distributed as _probe_dist
import torch.nn.functional as _probe_F
from torch.nn.parallel import DistributedDataParallel as _probe_DDP
from helpers.grading.shared_run import launch_gloo as _probe_launch
from helpers.comm import CommLedger as _probe_Ledger
from helpers.simulate import Link as _probe_Link

# Inputs scale with the question's secret seed: an output memorised for one call is worth nothing.
_probe_s = 1 + (_PROBE_SEED % 997) / 997
_probe_links = {"fast": _probe_Link("probe fast", 2e-6, 200e9), "slow": _probe_Link("probe slow", 50e-6, 1e9)}

def _probe_model():
    _probe_torch.manual_seed(_PROBE_SEED + 5)
    return _probe_torch.nn.Sequential(_probe_torch.nn.Linear(5, 24), _probe_torch.nn.Tanh(),
                                      _probe_torch.nn.Linear(24, 4))

def _probe_micro(sizes, step):
    g = _probe_torch.Generator().manual_seed(_PROBE_SEED + 500 + 17 * _probe_dist.get_rank() + step)
    x, y = _probe_torch.randn(sum(sizes), 5, generator=g), _probe_torch.randint(0, 4, (sum(sizes),), generator=g)
    return list(zip(x.split(sizes), y.split(sizes)))

def _probe_accumulate(sizes_per_rank, steps):
    # Unequal micro-batches (6 samples on every rank); a small bucket cap so a step has several buckets.
    model = _probe_DDP(_probe_model(), bucket_cap_mb=0.001)
    optimizer = _probe_torch.optim.SGD(model.parameters(), lr=0.3)
    sizes = sizes_per_rank[_probe_dist.get_rank()]
    losses, calls = [], []
    for step in range(steps):
        with _probe_Ledger() as ledger:
            losses.append(accumulate_and_step(model, optimizer, _probe_micro(sizes, step), _probe_F.cross_entropy))
        calls.append(ledger.totals().get("all_reduce", {"calls": 0})["calls"])
    return {"losses": losses, "all_reduces_from_step_3": calls[2:],
            "params": [p.detach().clone() for p in model.parameters()]}

def _probe_shards(batch, micro_batch_size):
    x = _probe_torch.arange(batch * 2.0).view(batch, 2)
    shards = micro_batches_of_rank(x, _probe_torch.arange(batch), micro_batch_size)
    return [[xi.tolist(), yi.tolist()] for xi, yi in shards]

def _probe_refuses(batch):
    try:
        micro_batches_of_rank(_probe_torch.zeros(batch, 1), _probe_torch.zeros(batch), 2)
    except ValueError:
        return "ValueError"
    return "accepted"
'''

PROBES = [
    Probe("5.1", "3 ranks, micro-batches [1, 5], [3, 3], [6]: losses, parameters, one bucket set per step",
          "_probe_launch(_probe_accumulate, 3, args=(([1, 5], [3, 3], [6]), 4), hang_timeout=15)", points=2),
    Probe("5.1", "2 ranks, four micro-batches each",
          "_probe_launch(_probe_accumulate, 2, args=(([1, 2, 1, 2], [3, 1, 1, 1]), 3), hang_timeout=15)"),
    Probe("5.2", "7e8 parameters, 24 GPUs, slow link, no overlap",
          "predict_step_time(7e8 * _probe_s, 24, 0.4, _probe_links['slow'])"),
    Probe("5.2", "3e8 fp16 parameters, 16 GPUs, fast link, 12 MiB buckets, overlap 0.6",
          "predict_step_time(3e8 * _probe_s, 16, 0.25 * _probe_s, _probe_links['fast'], bytes_per_param=2, "
          "bucket_cap_bytes=12 * 2**20, overlap=0.6)"),
    Probe("5.2", "a model smaller than the first bucket, 5 GPUs",
          "predict_step_time(100_000 + _PROBE_SEED % 50_000, 5, 0.01, _probe_links['slow'])"),
    Probe("5.2", "weak and strong efficiency, 48 GPUs",
          "[scaling_efficiency(1.2e9 * _probe_s, 48, 0.8, _probe_links[k], weak=w, overlap=0.5) "
          "for k in ('fast', 'slow') for w in (True, False)]", points=2),
    Probe("5.3", "27, 30 or 33 samples on 3 ranks, micro-batches of 4",
          "_probe_launch(_probe_shards, 3, args=(27 + 3 * (_PROBE_SEED % 3), 4))"),
    Probe("5.3", "a batch of 11 on 2 ranks is refused", "_probe_launch(_probe_refuses, 2, args=(11,))"),
]

# No question's probes call another question's answer (helpers/grading/reference.py).
USES = {}
