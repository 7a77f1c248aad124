"""Backend choice (NCCL needs one GPU per rank) and the NCCL set-up path, without a GPU (GPU counts faked)."""
import pytest
import torch

from helpers.backend import select_backend
from helpers.errors import LaunchError
from helpers.launcher import worker


@pytest.mark.parametrize("requested, world_size, gpus, expected", [
    ("auto", 4, 0, "gloo"), ("auto", 4, 2, "gloo"), ("auto", 4, 4, "nccl"), ("auto", 2, 8, "nccl"),
    ("gloo", 4, 8, "gloo"), ("nccl", 2, 2, "nccl"),
])
def test_select_backend(requested, world_size, gpus, expected):
    assert select_backend(requested, world_size, gpus) == expected


def test_nccl_needs_a_gpu_per_rank():
    with pytest.raises(LaunchError, match=r"world_size=4 but 2 CUDA GPU\(s\) were found.*lower world_size to 2"):
        select_backend("nccl", 4, 2)


def test_nccl_rank_binds_its_own_gpu(monkeypatch):
    # The NCCL path cannot run here; check that each rank selects GPU `rank` before joining.
    calls = {}
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    monkeypatch.setattr(torch.cuda, "set_device", lambda d: calls.setdefault("set_device", d))
    monkeypatch.setattr(worker.dist, "TCPStore", lambda *a, **k: object())
    monkeypatch.setattr(worker.dist, "PrefixStore", lambda prefix, store: store)
    monkeypatch.setattr(worker.dist, "init_process_group", lambda backend, **kw: calls.update(backend=backend, **kw))
    spec = {"host": "127.0.0.1", "port": 1, "prefix": "p/", "backend": "nccl", "hang_timeout": 5.0,
            "timeout_margin": 15.0}
    worker.init_group(3, 4, spec)
    assert calls["set_device"] == torch.device("cuda", 3)
    assert calls["device_id"] == torch.device("cuda", 3)
    assert calls["backend"] == "cpu:gloo,cuda:nccl" and calls["rank"] == 3 and calls["world_size"] == 4
    assert calls["timeout"].total_seconds() == 20.0


# --- the process group a launch joins (issue 16, item 1): faked GPU counts, NCCL never initialised ----

def _fake_gpus(monkeypatch, n):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: n > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: n)


@pytest.mark.parametrize("gpus, world_size, requested, joined", [
    (0, 2, "auto", "gloo"),                  # a laptop: nothing changes
    (1, 2, "auto", "gloo"),                  # fewer GPUs than ranks: Gloo on the CPU
    (2, 2, "auto", "cpu:gloo,cuda:nccl"),    # a GPU per rank: CUDA tensors over NCCL, CPU ones over Gloo
    (8, 4, "auto", "cpu:gloo,cuda:nccl"),
    (8, 4, "gloo", "gloo"),                  # the labs' checks pin Gloo on any machine
    (4, 4, "nccl", "cpu:gloo,cuda:nccl"),
])
def test_launch_joins_the_group_its_machine_needs(monkeypatch, gpus, world_size, requested, joined):
    import importlib

    launch_module = importlib.import_module("helpers.launch")  # `helpers.launch` is also the function

    _fake_gpus(monkeypatch, gpus)
    specs = []

    class CapturedRun:  # stands in for helpers.launcher.run.Run: no process starts
        def __init__(self, context, n, spec):
            specs.append(spec)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def wait(self):
            return []

    monkeypatch.setattr(launch_module, "Run", CapturedRun)
    launch_module.launch(print, world_size, backend=requested)
    calls = {}
    monkeypatch.setattr(torch.cuda, "set_device", lambda d: None)
    monkeypatch.setattr(worker.dist, "TCPStore", lambda *a, **k: object())
    monkeypatch.setattr(worker.dist, "PrefixStore", lambda prefix, store: store)
    monkeypatch.setattr(worker.dist, "init_process_group", lambda backend, **kw: calls.update(backend=backend, **kw))
    worker.init_group(world_size - 1, world_size, specs[0])
    assert calls["backend"] == joined
    on_gpu = joined != "gloo"
    assert calls["device_id"] == (torch.device("cuda", (world_size - 1) % gpus) if on_gpu else None)


def test_torch_parses_the_device_mapped_backend():
    # The string must be the form torch 2.13's BackendConfig accepts (torch/distributed/distributed_c10d.py).
    from torch.distributed.distributed_c10d import Backend, BackendConfig

    from helpers.backend import DEVICE_MAPPED_NCCL, process_group_backend

    mapping = BackendConfig(Backend(process_group_backend("nccl"))).get_device_backend_map()
    assert mapping == {"cpu": "gloo", "cuda": "nccl"} and process_group_backend("nccl") == DEVICE_MAPPED_NCCL
    assert process_group_backend("gloo") == "gloo"


@pytest.mark.parametrize("backend, nccl", [("gloo", False), ("nccl", True), ("cpu:gloo,cuda:nccl", True),
                                           ("cpu:gloo,cuda:gloo", False)])
def test_rank_device_reads_device_mapped_backends(backend, nccl):
    from helpers.backend import uses_nccl

    assert uses_nccl(backend) is nccl
