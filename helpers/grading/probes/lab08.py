"""Hidden tests of lab 08 (ZeRO-3 / FSDP from scratch). Public in this repository: see the README."""
import dataclasses

from helpers.grading.probes import Probe

SETUP = '''
import torch as _probe_torch
import torch.distributed as _probe_dist
from torch import nn as _probe_nn
from helpers.grading.shared_run import launch_gloo as _probe_launch
from helpers.comm import CommLedger as _probe_Ledger
from helpers.grading.checks.lab08.common import _ref_unshard as _probe_ref_unshard


def _probe_unit():
    # Nested two levels deep: Linear(2, 5), then (LayerNorm(5), Linear(5, 2)): 37 parameters, a prime.
    _probe_torch.manual_seed(_PROBE_SEED + 18)
    unit = _probe_nn.Sequential(_probe_nn.Linear(2, 5),
                                _probe_nn.Sequential(_probe_nn.LayerNorm(5), _probe_nn.Linear(5, 2)))
    with _probe_torch.no_grad():
        for p in unit.parameters():
            p.copy_(_probe_torch.randn(p.shape))
    return unit


def _probe_x():
    return _probe_torch.randn(4, 2, generator=_probe_torch.Generator().manual_seed(_PROBE_SEED + 81))


def _probe_layout(root):
    module = _probe_unit()
    if root:                                            # an inner unit first; the root takes the rest
        module = _probe_nn.Sequential(module, _probe_nn.Linear(2, 3))
        FlatShard(module[0])
    unit = FlatShard(module)
    return {"shard": unit.flat_shard.detach(), "numel": unit.numel, "padded": unit.padded_numel,
            "numels": list(unit.numels), "shapes": [list(s) for s in unit.shapes],
            "attrs": [attr for _, attr in unit.param_infos], "flat": [list(unit.flat.shape),
            unit.flat.untyped_storage().nbytes()], "params": [k for k, _ in module.named_parameters()]}


def _probe_mixed_layout():
    units = [FlatShard(_probe_unit(), param_dtype=_probe_torch.bfloat16, reduce_dtype=reduce)
             for reduce in (None, _probe_torch.float32)]
    return [{"dtypes": [str(u.param_dtype), str(u.reduce_dtype), str(u.flat.dtype), str(u.flat_shard.dtype)],
             "shard": u.flat_shard.detach(), "flat": [list(u.flat.shape), u.flat.untyped_storage().nbytes()]}
            for u in units]


def _probe_unshard(param_dtype=None):
    module = _probe_unit()
    unit = FlatShard(module, param_dtype)     # 8.1's __init__: the solution's (USES)
    with _probe_Ledger() as ledger:
        unit.unshard()
    views = [getattr(owner, attr).detach().clone() for owner, attr in unit.param_infos]
    loss = module(_probe_x().to(param_dtype)).square().sum()
    unit.flat.untyped_storage().resize_(0)
    unit.unshard()
    loss.backward()
    return {"views": views, "flat_grad": unit.flat.grad, "dtypes": [str(v.dtype) for v in views],
            "ops": [[r.op, r.payload_bytes] for r in ledger.records]}


def _probe_reshard():
    module = _probe_unit()
    unit = FlatShard(module)
    flat = unit.flat
    _probe_ref_unshard(unit)
    views = [getattr(owner, attr) for owner, attr in unit.param_infos]
    loss = module(_probe_x()).square().sum()
    unit.reshard()
    freed = [flat.untyped_storage().nbytes(), max(v.untyped_storage().nbytes() for v in views),
             sum(hasattr(owner, attr) for owner, attr in unit.param_infos)]
    unit.reshard()
    _probe_ref_unshard(unit)
    loss.backward()
    return {"freed": freed, "flat_grad": flat.grad}


def _probe_reduce():
    rank = _probe_dist.get_rank()
    unit = FlatShard(_probe_unit())
    grads = []
    for call in range(2):
        seed = _PROBE_SEED + 90 + 7 * call + rank
        g = _probe_torch.randn(unit.padded_numel, generator=_probe_torch.Generator().manual_seed(seed))
        g[unit.numel:] = 0
        unit.flat.grad = g
        with _probe_Ledger() as ledger:
            unit.reduce_scatter_grads()
        grads.append(unit.flat_shard.grad.clone())
    return {"grads": grads, "freed": unit.flat.grad is None, "ops": [r.op for r in ledger.records]}


def _probe_mixed_reduce():
    # bfloat16 gradients reduced in bfloat16, then in float32; on 2 ranks a sum is one rounding in any order
    out = []
    for reduce in (None, _probe_torch.float32):
        unit = FlatShard(_probe_unit(), _probe_torch.bfloat16, reduce)
        g = _probe_torch.randn(unit.padded_numel, generator=_probe_torch.Generator().manual_seed(
            _PROBE_SEED + 95 + _probe_dist.get_rank())).to(_probe_torch.bfloat16)
        g[unit.numel:] = 0
        unit.flat.grad = g
        with _probe_Ledger() as ledger:
            unit.reduce_scatter_grads()
        out.append({"grad": unit.flat_shard.grad, "dtype": str(unit.flat_shard.grad.dtype),
                    "ops": [[r.op, r.payload_bytes] for r in ledger.records]})
    return out


class _probe_Block(_probe_nn.Module):
    def __init__(self):
        super().__init__()
        self.up, self.norm, self.down = _probe_nn.Linear(5, 7), _probe_nn.LayerNorm(7), _probe_nn.Linear(7, 5)

    def forward(self, x):
        return x + self.down(_probe_torch.relu(self.norm(self.up(x))))


def _probe_train(steps, by_type=False, param_dtype=None):
    rank, n = _probe_dist.get_rank(), _probe_dist.get_world_size()
    _probe_torch.manual_seed(_PROBE_SEED + 28)
    # root parameters before and after the units: the root's unit holds both Linears
    model = _probe_nn.Sequential(_probe_nn.Linear(3, 5), _probe_nn.Sequential(_probe_Block(), _probe_Block()),
                                 _probe_nn.Linear(5, 2))
    g = _probe_torch.Generator().manual_seed(_PROBE_SEED + 70 + rank)
    batches = [(_probe_torch.randn(5, 3, generator=g), _probe_torch.randn(5, 2, generator=g)) for _ in range(steps)]
    units = (_probe_Block,) if by_type else ["1.0", "1.1"]
    units = train_fsdp(model, units, batches, lr=0.1, momentum=0.5, param_dtype=param_dtype)
    full = []
    for module in (model[1][0], model[1][1], model):
        shard = module.flat_shard.detach()
        out = shard.new_empty(n * shard.numel())
        _probe_dist.all_gather_single(out, shard)
        full.append(out)
    return {"full": full, "held": sum(u.flat.untyped_storage().nbytes() for u in units)}
'''

PROBES = [
    Probe("8.1", "a unit nested two levels deep, 4 ranks", "_probe_launch(_probe_layout, 4, args=(False,), "
          "hang_timeout=20)", points=2),
    Probe("8.1", "the root's unit after an inner one, 3 ranks",
          "_probe_launch(_probe_layout, 3, args=(True,), hang_timeout=20)"),
    Probe("8.2", "a unit nested two levels deep, 3 ranks", "_probe_launch(_probe_unshard, 3, hang_timeout=20)",
          points=2),
    Probe("8.1", "bfloat16 compute, reduced in bfloat16 and in float32, 3 ranks",
          "_probe_launch(_probe_mixed_layout, 3, hang_timeout=20)"),
    Probe("8.2", "the same unit, 4 ranks", "_probe_launch(_probe_unshard, 4, hang_timeout=20)"),
    Probe("8.2", "the same unit in bfloat16, 3 ranks",
          "_probe_launch(_probe_unshard, 3, args=(_probe_torch.bfloat16,), hang_timeout=20)"),
    Probe("8.3", "free after a forward, twice, then gather again, 3 ranks",
          "_probe_launch(_probe_reshard, 3, hang_timeout=20)", points=2),
    Probe("8.4", "two backward passes, 4 ranks", "_probe_launch(_probe_reduce, 4, hang_timeout=20)", points=2),
    Probe("8.4", "two backward passes, 2 ranks", "_probe_launch(_probe_reduce, 2, hang_timeout=20)"),
    Probe("8.4", "bfloat16 gradients reduced in bfloat16 and in float32, 2 ranks",
          "_probe_launch(_probe_mixed_reduce, 2, hang_timeout=20)"),
    Probe("8.5", "root parameters before and after the units, 3 ranks, 3 steps",
          "_probe_launch(_probe_train, 3, args=(3,), hang_timeout=30)", points=3),
    Probe("8.5", "the same model, 2 ranks, 2 steps", "_probe_launch(_probe_train, 2, args=(2,), hang_timeout=30)",
          points=2),
    Probe("8.5", "the same model, blocks given by type, bfloat16, 2 ranks, 2 steps",
          "_probe_launch(_probe_train, 2, args=(2, True, _probe_torch.bfloat16), hang_timeout=30)"),
]

# Using PyTorch's FSDP scores 0 on the questions that rebuild it.
_FORBIDDEN = ("fully_shard", "FullyShardedDataParallel")
PROBES = [dataclasses.replace(p, forbidden=_FORBIDDEN) if p.question in ('8.1', '8.2', '8.3', '8.4', '8.5') else p
          for p in PROBES]

# The earlier answers each question's probes call, directly or through other answers, graded with the
# solution's versions bound in their place (helpers/grading/reference.py): 8.2-8.4 are methods of 8.1's FlatShard;
# train_fsdp builds FlatShards, whose hooks call 8.2-8.4.
USES = {'8.2': ('8.1',), '8.3': ('8.1',), '8.4': ('8.1',), '8.5': ('8.1', '8.2', '8.3', '8.4')}
