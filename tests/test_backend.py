"""Backend choice (NCCL needs one GPU per rank) and the NCCL set-up path, without a GPU."""
import pytest
import torch

from helpers import worker
from helpers.backend import select_backend
from helpers.errors import LaunchError


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
    assert calls["backend"] == "nccl" and calls["rank"] == 3 and calls["world_size"] == 4
    assert calls["timeout"].total_seconds() == 20.0
