"""The CPU-side device guard (helpers.launcher.device_guard): planted CPU-only rank functions fail, correct ones
pass."""
import os
import re
import sys

import cloudpickle
import pytest
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.algorithms import Join

from helpers import RankFailed, launch
from helpers.backend import rank_device
from helpers.launcher import device_guard
from helpers.launcher.device_guard import SENTINEL, Guard, is_host, scan_source

# Rank functions travel by value: by reference every rank would import this module, and pytest with it
# (0.16-0.2 CPU-s a rank, in every launch).
cloudpickle.register_pickle_by_value(sys.modules[__name__])

HANG_S = 30.0


def correct():
    """Model, data and every collective's tensor on rank_device(); DDP and an object collective too."""
    dev = rank_device()
    model = nn.Linear(4, 2).to(dev)
    model(torch.randn(3, 4, device=dev)).sum().backward()
    for p in model.parameters():
        dist.all_reduce(p.grad)
    counts = torch.ones(2, device=dev)
    dist.all_reduce(counts)
    ranks = [None] * dist.get_world_size()
    dist.all_gather_object(ranks, dist.get_rank())  # torch picks this one's device itself
    return counts.tolist(), ranks, str(dev)


def data_made_on_the_cpu():
    """chapter 02's rank_data before the fix: torch.arange without a device."""
    dist.all_reduce(torch.arange(4.0))


def model_made_on_the_cpu():
    """The data is right, the model is not: its gradients stay on the CPU."""
    model = nn.Linear(4, 2)
    model(torch.randn(3, 4, device=rank_device())).sum().backward()
    dist.all_reduce(model.weight.grad)


def ddp_of_a_cpu_model():
    nn.parallel.DistributedDataParallel(nn.Linear(4, 2))


def ddp_under_join():
    """DDP's Join all-reduces flags it makes with device=self.device: right on a GPU, so not refused."""
    dev = rank_device()
    model = nn.parallel.DistributedDataParallel(nn.Linear(4, 2).to(dev))
    with Join([model]):
        for _ in range(1 + dist.get_rank()):  # uneven: rank 1 runs one step more
            model(torch.randn(3, 4, device=dev)).sum().backward()
    return [p.detach().cpu() for p in model.parameters()]


def shipped_tensor(t):
    """A tensor made in the kernel arrives in host memory: it must be moved."""
    dist.broadcast(t, src=0)


@pytest.mark.timeout(120)
def test_pretend_fails_planted_cpu_only_rank_functions(monkeypatch):
    monkeypatch.setenv(device_guard.ENV, "pretend")
    assert launch(correct, 2, hang_timeout=HANG_S) == [([2.0, 2.0], [0, 1], "cpu:0")] * 2
    joined = launch(ddp_under_join, 2, hang_timeout=HANG_S)
    assert all(torch.equal(a, b) for a, b in zip(*joined)), "Join ends with equal parameters"
    for planted, line in [(data_made_on_the_cpu, "dist.all_reduce(torch.arange(4.0))"),
                          (model_made_on_the_cpu, "dist.all_reduce(model.weight.grad)"),
                          (ddp_of_a_cpu_model, "nn.parallel.DistributedDataParallel(nn.Linear(4, 2))")]:
        with pytest.raises(RankFailed, match="DeviceGuardError") as failure:
            launch(planted, 2, hang_timeout=HANG_S)
        message = str(failure.value)
        assert "rank_device()" in message and line in message, message
    with pytest.raises(RankFailed, match=r"broadcast at .*test_device_guard.py:\d+ in shipped_tensor got a \(3,\) "
                                         r"float32 tensor made in host memory"):
        launch(shipped_tensor, 2, args=(torch.zeros(3),), hang_timeout=HANG_S)


@pytest.mark.timeout(60)
def test_unset_guard_changes_nothing(monkeypatch):
    monkeypatch.delenv(device_guard.ENV, raising=False)
    assert launch(data_made_on_the_cpu, 2, hang_timeout=HANG_S) == [None, None]


def meta_tensor_collective():
    dist.all_reduce(torch.ones(2, device="meta"))


@pytest.mark.timeout(60)
def test_check_mode_compares_real_devices(monkeypatch):
    # "check" is the mode for GPU machines; here rank_device() is the CPU, so a meta tensor stands in.
    monkeypatch.setenv(device_guard.ENV, "check")
    assert launch(data_made_on_the_cpu, 1, hang_timeout=HANG_S) == [None]
    with pytest.raises(RankFailed, match=r"all_reduce at .* got a \(2,\) float32 tensor on meta"):
        launch(meta_tensor_collective, 1, hang_timeout=HANG_S)


def test_bad_mode_is_named(monkeypatch):
    monkeypatch.setenv(device_guard.ENV, "on")
    with pytest.raises(ValueError, match="DP_COURSE_DEVICE_GUARD='on' is not one of"):
        device_guard.mode_from_env()


def test_placement_follows_cuda_rules_in_process():
    new, init = nn.Parameter.__new__, nn.parallel.DistributedDataParallel.__init__
    with Guard("pretend", shipped=()):
        assert rank_device() == SENTINEL
        host, placed = torch.randn(3), torch.zeros(3, device=rank_device())
        assert is_host(host) and not is_host(placed) and is_host(torch.zeros_like(host))
        moved = host.to(rank_device())
        assert moved is not host and is_host(host) and not is_host(moved)  # a copy, as across devices
        assert is_host(placed.cpu()) and not is_host(placed * 2) and is_host(host + 1)
        model = nn.Linear(2, 2)
        assert all(is_host(p) for p in model.parameters())
        model.to(rank_device())
        assert not any(is_host(p) for p in model.parameters())
        cpu_model = nn.Linear(2, 2)
        cpu_model(torch.ones(1, 2, device=rank_device())).sum().backward()
        assert is_host(cpu_model.weight.grad)
    assert rank_device() == torch.device("cpu")
    assert (nn.Parameter.__new__, nn.parallel.DistributedDataParallel.__init__) == (new, init)


def test_to_with_copy_is_followed():
    # torch.amp.GradScaler.step copies its scale with .to(device=..., non_blocking=True, copy=True); the guard's
    # parsing of the target device refused the copy argument, so a scaler failed in every rank under "pretend".
    with Guard("pretend", shipped=()):
        host, placed = torch.ones(2), torch.ones(2, device=rank_device())
        same = placed.to(device=rank_device(), non_blocking=True, copy=True)
        moved = host.to(rank_device(), copy=True)
        assert same is not placed and not is_host(same) and not is_host(moved) and is_host(host)


def test_a_move_issued_by_torch_distributed_keeps_the_mark():
    # FSDP1 moves the module to its device_id, which a rank passes as "cpu" on a CPU machine (FSDP1 refuses cpu:0):
    # that must not make host a parameter the rank put on rank_device(), nor the device of a host one.
    # The same .to("cpu") in the rank's own code does move to the host.
    move = "moved = t.to(torch.device('cpu'))"
    inside = compile(move, os.path.join(device_guard._TORCH_DISTRIBUTED, "fsdp", "_init_utils.py"), "exec")
    outside = compile(move, __file__, "exec")
    with Guard("pretend", shipped=()):
        placed = rank_device()
        for code, made_on, host in [(inside, placed, False), (inside, None, True), (outside, placed, True)]:
            scope = {"torch": torch, "t": torch.zeros(3, device=made_on)}
            exec(code, scope)
            assert is_host(scope["moved"]) is host, (code.co_filename, made_on)


@pytest.mark.parametrize("source, found", [
    ("dp = nn.DataParallel(make_model())", "DataParallel(...) needs a GPU"),
    ("dp = nn.DataParallel(m)\nprint(torch.cuda.device_count())", "DataParallel(...) needs a GPU"),  # a mention
    ("if torch.cuda.is_available():\n    dp = nn.DataParallel(make_model().cuda())", None),
    ("peak = torch.cuda.max_memory_allocated()", "torch.cuda.max_memory_allocated(...) needs a GPU"),
    ('mesh = init_device_mesh("cpu", (4,))', "pass rank_device().type"),
    ("mesh = init_device_mesh(rank_device().type, (4,))", None),
    ('x = torch.zeros(3, device="cpu")', "pass device=rank_device()"),
    ("%%ranks 2\nx = torch.zeros(3)", None),
])
def test_scan_source_finds_what_the_runtime_guard_cannot(source, found):
    messages = [m for _, m in scan_source(source)]
    assert (found is None and not messages) or any(found in m for m in messages), messages


PLANTED_CELLS = {
    "98_planted": "def made_on_the_cpu():\n    t = torch.ones(3)\n    dist.all_reduce(t)\n    return t.sum().item()\n",
    "99_right": "def made_on_the_cpu():\n    t = torch.ones(3, device=rank_device())\n    dist.all_reduce(t)\n"
                "    return t.sum().item()\n",
}


@pytest.mark.timeout(300)
def test_chapters_run_under_the_guard_and_a_planted_cpu_only_cell_fails(tmp_path, monkeypatch, capsys):
    # make test loads tests/device_guard_plugin.py: a chapter's cells run with the guard pretending.
    # The same pytest command runs here in-process (pytest.main), not as a subprocess: its kernels are forks of
    # this worker's zygote (tests/warm_kernels.py) instead of a second zygote importing torch again
    # (measured: 18-27 -> ~5 CPU-s).
    import nbformat

    from helpers.grading.prepare.labgen import ROOT

    chapters = tmp_path / "chapters"
    chapters.mkdir()
    imports = ("import torch\nimport torch.distributed as dist\nfrom helpers import launch\n"
               "from helpers.backend import rank_device")
    for name, cell in PLANTED_CELLS.items():
        cells = [imports, cell, "print(launch(made_on_the_cpu, 2))"]
        nbformat.write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells]),
                       chapters / f"{name}.ipynb")
    monkeypatch.delenv(device_guard.ENV, raising=False)
    monkeypatch.setenv("JUPYTER_PATH", os.environ.get("JUPYTER_PATH", ""))  # the inner run prepends its kernelspec
    monkeypatch.chdir(ROOT)
    # This test's timeout (the signal alarm) bounds the inner run: no:timeout keeps the inner items from resetting
    # it; a cell that hangs is cut by nbval's cell timeout. no:xdist: the inner run is one process, as before.
    pytest.main(["-p", "tests.device_guard_plugin", "-p", "no:cacheprovider", "-p", "no:timeout", "-p", "no:xdist",
                 "-p", "tests.warm_kernels", "--nbval-lax", "--nbval-kernel-name", "python3-warm",
                 "--nbval-cell-timeout", "120", "-q", "--color=no", str(chapters)])
    stdout = capsys.readouterr().out
    assert "1 failed, 5 passed" in stdout, stdout[-3000:]
    # pytest ends the FAILED line with " - <reason>" when the terminal is wide enough for it.
    assert re.search(r"98_planted\.ipynb::Cell 2\b", stdout) and "DeviceGuardError" in stdout, stdout[-3000:]


def test_no_cell_of_the_course_is_cpu_only_by_reading():
    # What the runtime guard cannot see (outside a rank, a "cpu" mesh, unguarded GPU-only calls), read in every
    # code cell of the chapters, labs and solutions.
    import nbformat

    from helpers.grading.prepare.labgen import ROOT

    found = []
    for path in sorted(ROOT.glob("chapters/*.ipynb")) + sorted(ROOT.glob("labs/*.ipynb")) + \
            sorted(ROOT.glob("solutions/*.ipynb")):
        cells = [c for c in nbformat.read(path, as_version=4).cells if c.cell_type == "code"]
        found += [f"{path.relative_to(ROOT)} cell {i} line {line}: {what}"
                  for i, cell in enumerate(cells) for line, what in scan_source(cell.source)]
    assert not found, "\n".join(found)
