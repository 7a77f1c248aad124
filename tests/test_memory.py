"""helpers.memory: storage-exact state counting and peak process memory."""
import os
import sys
import time

import cloudpickle
import pytest
import torch
import torch.distributed as dist
from torch import nn

from helpers.memory import choose_method, local_tensor, peak_memory, state_bytes

# Rank functions travel by value: by reference every rank would import this module, and pytest with it
# (0.16-0.2 CPU-s a rank, in every launch).
cloudpickle.register_pickle_by_value(sys.modules[__name__])

MB = 10**6
LINEAR_BYTES = (100 * 50 + 50) * 4  # nn.Linear(100, 50) in fp32


def _backward(model, inputs):
    model(inputs).sum().backward()


def test_linear_params_and_grads_are_exact():
    model = nn.Linear(100, 50)
    assert state_bytes(model) == {"params": LINEAR_BYTES, "grads": 0, "optimizer": 0, "total": LINEAR_BYTES}
    _backward(model, torch.randn(3, 100))
    counts = state_bytes(model)
    assert counts["grads"] == LINEAR_BYTES
    assert counts["total"] == 2 * LINEAR_BYTES


def test_tied_weights_count_once():
    embed, head = nn.Embedding(30, 8), nn.Linear(8, 30, bias=False)
    head.weight = embed.weight  # weight tying, as in GPT-2
    model = nn.Sequential(embed, head)
    assert state_bytes(model)["params"] == 30 * 8 * 4


def test_views_into_a_flat_buffer_count_the_whole_buffer_once():
    flat = torch.zeros(1000)  # 4000 bytes; the two views below cover 900 elements
    model = nn.Module()
    model.a = nn.Parameter(flat[:600].view(20, 30))
    model.b = nn.Parameter(flat[600:900])
    assert state_bytes(model)["params"] == 1000 * 4


def test_adam_state_counts_moments_and_step_scalars():
    model = nn.Linear(100, 50)
    opt = torch.optim.Adam(model.parameters())
    _backward(model, torch.randn(3, 100))
    opt.step()
    counts = state_bytes(model, opt)
    # exp_avg + exp_avg_sq (fp32) per element, plus one fp32 `step` scalar per parameter tensor:
    # the scalars are real allocations, so they count.
    assert counts["optimizer"] == 2 * LINEAR_BYTES + 2 * 4
    assert counts["optimizer"] >= 8 * (100 * 50 + 50)


def test_plain_sgd_has_no_optimizer_state():
    model = nn.Linear(100, 50)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)  # its params are the model's: not counted again
    _backward(model, torch.randn(3, 100))
    opt.step()
    assert state_bytes(model, opt)["optimizer"] == 0


def test_optimizer_over_a_master_shard_counts_it_as_optimizer_state():
    model = nn.Linear(100, 50)
    shard = nn.Parameter(torch.cat([p.detach().flatten() for p in model.parameters()])[:1000].clone())
    shard.grad = torch.ones(1000)  # a hand-written ZeRO-2 keeps the reduced gradient shard here
    opt = torch.optim.SGD([shard], lr=0.1)
    counts = state_bytes(model, opt)
    assert counts["params"] == LINEAR_BYTES
    assert counts["optimizer"] == 1000 * 4
    assert counts["grads"] == 1000 * 4


def test_extra_adds_hand_made_shards_once_and_new_categories():
    model = nn.Linear(100, 50)
    exp_avg = torch.zeros(2525)
    counts = state_bytes(model, extra={"optimizer": [exp_avg, exp_avg[10:]], "buffers": [torch.zeros(3)]})
    assert counts["optimizer"] == 2525 * 4
    assert counts["buffers"] == 12
    assert counts["total"] == LINEAR_BYTES + 2525 * 4 + 12
    with pytest.raises(ValueError, match="total"):
        state_bytes(model, extra={"total": []})


def test_freed_and_meta_storages_count_zero():
    model = nn.Linear(100, 50)
    model.weight.untyped_storage().resize_(0)  # what FSDP does to an unsharded parameter after use
    assert state_bytes(model)["params"] == 50 * 4
    with torch.device("meta"):
        assert state_bytes(nn.Linear(100, 50))["params"] == 0


@pytest.fixture
def one_rank_group():
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    from torch.distributed.device_mesh import init_device_mesh
    yield init_device_mesh("cpu", (1,))
    dist.destroy_process_group()


@pytest.mark.timeout(60)
def test_dtensor_counts_its_local_shard(one_rank_group):
    from torch.distributed.tensor import DTensor, Shard, distribute_tensor
    # A shard that claims a global shape twice its local one, as rank 0 of 2 would hold.
    half = DTensor.from_local(torch.zeros(8, 4), one_rank_group, [Shard(0)], run_check=False,
                              shape=torch.Size([16, 4]), stride=(4, 1))
    assert half.shape == (16, 4)
    assert local_tensor(half).shape == (8, 4)
    assert local_tensor(half).data_ptr() == half._local_tensor.data_ptr()
    plain = torch.zeros(3)
    assert local_tensor(plain) is plain
    model = nn.Module()
    model.w = nn.Parameter(half)
    model.v = nn.Parameter(distribute_tensor(torch.randn(10, 4), one_rank_group, [Shard(0)]))
    assert state_bytes(model)["params"] == (8 * 4 + 10 * 4) * 4


@pytest.mark.timeout(60)
def test_dtensor_grads_and_adam_state(one_rank_group):
    from torch.distributed.tensor import Shard, distribute_tensor
    model = nn.Module()
    model.w = nn.Parameter(distribute_tensor(torch.randn(10, 4), one_rank_group, [Shard(0)]))
    opt = torch.optim.Adam(model.parameters())
    (model.w * 2).sum().backward()
    opt.step()
    assert state_bytes(model, opt) == {"params": 160, "grads": 160, "optimizer": 2 * 160 + 4,
                                       "total": 3 * 160 + 160 + 4}


def test_choose_method():
    assert choose_method("cuda", hwm_resettable=False, can_sample=False) == "cuda"
    assert choose_method("cpu", hwm_resettable=True, can_sample=True) == "vmhwm"
    assert choose_method("cpu", hwm_resettable=False, can_sample=True) == "sampler"
    with pytest.raises(RuntimeError, match="psutil"):
        choose_method("cpu", hwm_resettable=False, can_sample=False)


def _vmhwm_works():
    with peak_memory() as probe:
        pass
    return probe.method == "vmhwm"


METHODS = ["sampler", pytest.param("vmhwm", marks=pytest.mark.skipif(
    not os.path.exists("/proc/self/clear_refs") or not _vmhwm_works(), reason="VmHWM cannot be reset here"))]


@pytest.mark.timeout(30)
@pytest.mark.parametrize("method", METHODS)
def test_peak_sees_a_200mb_tensor_and_ignores_an_earlier_larger_peak(method):
    earlier = torch.ones(100 * MB)  # 400 MB: a process-lifetime mark would report this one
    del earlier
    with peak_memory(method=method) as result:
        x = torch.ones(50 * MB)  # 200 MB
        time.sleep(0.05)  # the sampler reads every few ms; a short hold makes the transient certain
        del x  # freed inside the block: only a peak, not the end state, can show it
    assert result.method == method
    assert result.delta_bytes == result.peak_bytes - result.start_bytes
    assert 190 * MB <= result.delta_bytes < 300 * MB


@pytest.mark.timeout(60)
@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # torch.jit, used inside ZeroRedundancyOptimizer
def test_zero_redundancy_optimizer_state_lives_in_its_local_optimizer(one_rank_group):
    from torch.distributed.optim import ZeroRedundancyOptimizer
    model = nn.Linear(100, 50)
    opt = ZeroRedundancyOptimizer(model.parameters(), torch.optim.Adam)
    _backward(model, torch.randn(3, 100))
    opt.step()
    assert len(opt.state) == 0  # the wrapper's own state stays empty: the shard is in opt.optim
    assert state_bytes(model, opt)["optimizer"] == 2 * LINEAR_BYTES + 2 * 4


@pytest.mark.timeout(60)
def test_fsdp2_fully_shard_params_grads_and_adam(one_rank_group):
    from torch.distributed.fsdp import fully_shard
    model = fully_shard(nn.Linear(100, 50), mesh=one_rank_group)
    opt = torch.optim.Adam(model.parameters())
    _backward(model, torch.randn(3, 100))
    opt.step()
    assert state_bytes(model, opt) == {"params": LINEAR_BYTES, "grads": LINEAR_BYTES,
                                       "optimizer": 2 * LINEAR_BYTES + 2 * 4, "total": 4 * LINEAR_BYTES + 8}


def _two_rank_counts():
    """Each strategy on 2 ranks (launched by helpers.launch): this rank's counts, and the ZeRO optimizer state
    summed over the ranks."""
    import warnings
    warnings.filterwarnings("ignore")
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import FullyShardedDataParallel, fully_shard
    from torch.distributed.optim import ZeroRedundancyOptimizer

    def trained(model, opt):
        _backward(model, torch.randn(3, 100))
        opt.step()
        return state_bytes(model, opt)

    def summed(nbytes):
        t = torch.tensor([nbytes])
        dist.all_reduce(t)
        return int(t)

    def mlp():
        return nn.Sequential(nn.Linear(100, 50), nn.Linear(50, 10))

    model = mlp()
    zero = trained(model, ZeroRedundancyOptimizer(model.parameters(), torch.optim.Adam))
    zero_summed = summed(zero["optimizer"])
    model = FullyShardedDataParallel(mlp(), use_orig_params=True, device_id=torch.device("cpu"))
    fsdp1 = trained(model, torch.optim.Adam(model.parameters()))
    mesh = init_device_mesh("cpu", (2,))
    model = mlp()
    fully_shard(model[0], mesh=mesh)
    fully_shard(model, mesh=mesh)
    fsdp2 = trained(model, torch.optim.Adam(model.parameters()))
    return zero, zero_summed, fsdp1, fsdp2


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_two_ranks_count_local_shards():
    """Per-rank counts are this rank's share; summed over ranks, the whole. The ranks are forks of the launcher's
    forkserver (torch imported once), not mp.spawn's fresh interpreters (measured: 17 CPU-s before)."""
    from helpers.launch import launch
    full = 5560 * 4  # Linear(100, 50) + Linear(50, 10), fp32
    for zero, zero_summed, fsdp1, fsdp2 in launch(_two_rank_counts, 2, hang_timeout=60):
        assert zero["params"] == full and zero["optimizer"] < 2 * full
        assert zero_summed == 2 * full + 4 * 4  # 4 `step` scalars, each on one rank
        assert full / 2 <= fsdp1["params"] <= full / 2 + 64  # one flat shard, padded for alignment
        assert fsdp2["params"] == fsdp2["grads"] == full / 2  # every dim 0 here divides by 2: no padding
