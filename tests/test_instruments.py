"""The issue's acceptance checks across instruments: one DDP step and one FSDP2 step on 4 ranks."""
import sys

import cloudpickle
import pytest
import torch
import torch.distributed as dist
from torch import nn

from helpers import launch
from helpers.comm import CommLedger
from helpers.memory import state_bytes

# Rank functions travel by value: by reference every rank would import this module, and pytest with it
# (0.16-0.2 CPU-s a rank, in every launch).
cloudpickle.register_pickle_by_value(sys.modules[__name__])

N = 4


def _mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 8))


PSI = sum(p.numel() for p in _mlp().parameters())


def _batch():
    torch.manual_seed(1 + dist.get_rank())  # different data on every rank
    return torch.randn(16, 32)


def _ddp_step():
    from torch.nn.parallel import DistributedDataParallel as DDP

    model = DDP(_mlp())
    opt = torch.optim.Adam(model.parameters())
    with CommLedger() as ledger:
        model(_batch()).square().mean().backward()
    opt.step()
    return ledger.totals(), state_bytes(model, opt)


@pytest.mark.timeout(120)
def test_ddp_step_bytes_on_the_wire_and_in_memory():
    for totals, memory in launch(_ddp_step, N, hang_timeout=20):
        assert totals["all_reduce"]["payload_bytes"] == 4 * PSI
        assert totals["all_reduce"]["wire_bytes"] == 4 * PSI * 2 * (N - 1) // N
        assert memory["params"] == 4 * PSI and memory["grads"] == 4 * PSI
        assert memory["optimizer"] >= 8 * PSI  # Adam: exp_avg + exp_avg_sq, fp32 (+ step scalars)


def _fsdp2_step():
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    model = _mlp()
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, mesh=mesh, reshard_after_forward=True)
    fully_shard(model, mesh=mesh, reshard_after_forward=True)
    opt = torch.optim.Adam(model.parameters())
    with CommLedger() as ledger:
        model(_batch()).square().mean().backward()
    opt.step()
    return ledger.totals(), state_bytes(model, opt)


@pytest.mark.timeout(120)
def test_fsdp2_step_moves_1_5x_and_holds_1_over_n():
    ddp_wire = 4 * PSI * 2 * (N - 1) // N
    for totals, memory in launch(_fsdp2_step, N, hang_timeout=20):
        wire = totals["all_gather"]["wire_bytes"] + totals["reduce_scatter"]["wire_bytes"]
        assert wire / ddp_wire == pytest.approx(1.5, rel=0.03)  # padding aside
        # Each rank holds its shard: about 1/N of DDP's 4 psi bytes (shards are padded to equal size).
        assert memory["params"] == pytest.approx(4 * PSI / N, rel=0.05)
        assert memory["grads"] == pytest.approx(4 * PSI / N, rel=0.05)
        assert memory["optimizer"] >= 8 * PSI / N
