"""`make gpu-check` (scripts/gpu_check.py) without a GPU: its one-line exit, its report from a fake run, its inputs."""
import importlib.util
import os
import pathlib
import re
import subprocess
import sys

import cloudpickle
import pytest
import torch
import torch.distributed as dist

from helpers import launch

# Rank functions travel by value: by reference every rank would import this module, and pytest with it
# (0.16-0.2 CPU-s a rank, in every launch).
cloudpickle.register_pickle_by_value(sys.modules[__name__])

ROOT = pathlib.Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "scripts" / "gpu_check.py")
gpu_check = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(gpu_check)


@pytest.mark.timeout(60)
def test_without_a_gpu_it_says_so_in_one_line_and_exits_zero(tmp_path):
    done = subprocess.run([sys.executable, "scripts/gpu_check.py", "--out", str(tmp_path / "out")], cwd=ROOT,
                          capture_output=True, text=True, timeout=50, env={"CUDA_VISIBLE_DEVICES": "", "PATH": ""})
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("\n") == 1 and "no CUDA GPU" in done.stdout, done.stdout
    assert not (tmp_path / "out").exists()


def test_report_of_a_fake_run(tmp_path):
    rows = [{"rank": r, "op": "all_reduce", "device": f"cuda:{r}", "dtype": "float32", "payload_bytes": 4000,
             "wire_bytes": 4000, "start": 1.0, "end": 1.25} for r in (0, 1) for _ in range(3)]
    results = [
        gpu_check.Result("chapters/02_collectives.ipynb", True, 12.5, cells=[(4, 0.5, "ok"), (6, 3.25, "ok")],
                         devices={0: ["cuda:0"], 1: ["cuda:1"]}, collectives=rows,
                         parameters={"BACKEND": "nccl", "WORLD_SIZE": 2}),
        gpu_check.Result("chapters/99_appendix_instruments.ipynb", False, 3.0, cells=[(12, 1.0, "error")],
                         devices={0: ["cpu", "cuda:0"]}, error="PapermillExecutionError: DeviceGuardError: rank 0 ..."),
        gpu_check.Result("chapters/capstone/train_gpt.py (torchrun)", True, 40.0, output="rank 0: ddp loss 4.1 -> 2.0"),
    ]
    info = {"gpus": 2, "gpu names": "NVIDIA A100", "torch": "2.13.0"}
    text = gpu_check.write_report(results, info, tmp_path / "report.md").read_text()
    assert "| gpus | 2 |" in text and "**2 of 3 passed.**" in text
    assert "| chapters/02_collectives.ipynb | pass | 12.5 | [rank 0] cuda:0; [rank 1] cuda:1 |" in text
    assert "| chapters/99_appendix_instruments.ipynb | FAIL | 3.0 | [rank 0] cpu, cuda:0 |" in text
    assert "| 6 | 3.25 | ok |" in text and "| 12 | 1.00 | error |" in text  # every cell's time
    assert "- `[rank 1]` cuda:1" in text and "DeviceGuardError: rank 0" in text
    # measured bytes per collective: per rank, op, device and dtype
    assert "| 1 | all_reduce | cuda:1 | float32 | 3 | 12000 | 12000 | 3 | 0.750000 |" in text
    assert "Parameters: `BACKEND = 'nccl'`, `WORLD_SIZE = 2`" in text and "rank 0: ddp loss 4.1 -> 2.0" in text


def test_parameters_cap_world_sizes_at_the_gpu_count():
    chapter00 = ROOT / "chapters" / "00_first_distributed_program.ipynb"
    assert gpu_check.parameters_for(chapter00, 2) == {"BACKEND": "nccl", "WORLD_SIZE": 2}
    assert gpu_check.parameters_for(chapter00, 8) == {"BACKEND": "nccl", "WORLD_SIZE": 4}
    chapter07 = ROOT / "chapters" / "07_zero_1_and_2.ipynb"
    params = gpu_check.parameters_for(chapter07, 3)
    assert params["WORLD_SIZE"] == 3 and params["WORLD_SIZES"] == [2, 3] and params["ZRO_WORLD_SIZE"] == 3


def test_parameters_keep_chapter_09s_mesh_whole_and_one_gpu_on_auto():
    # Chapter 09 builds REPLICAS x (WORLD_SIZE // REPLICAS) meshes, REPLICAS = 2: on 3 GPUs a world of 3 is no such
    # mesh, and on 2 the shard groups would be of 1 (nothing to gather: its byte table fails). So its meshes stay
    # at 4 ranks, on Gloo ("auto"), and its 2-rank section runs on the GPUs. One GPU cannot hold 2 NCCL ranks, and
    # chapters 09 and 11 launch a fixed 2.
    chapter09 = ROOT / "chapters" / "09_pytorch_fsdp.ipynb"
    for gpus in (2, 3):
        assert gpu_check.parameters_for(chapter09, gpus) == {"BACKEND": "auto", "AC_WORLD_SIZE": 2}
    assert gpu_check.parameters_for(chapter09, 4) == {"BACKEND": "nccl", "WORLD_SIZE": 4, "AC_WORLD_SIZE": 2}
    for chapter in (chapter09, ROOT / "chapters" / "11_operations.ipynb"):
        assert gpu_check.parameters_for(chapter, 1) == {"BACKEND": "auto"}


def _one_all_reduce():
    t = torch.ones(10)
    dist.all_reduce(t)
    return t[0].item()


@pytest.mark.timeout(60)
def test_ranks_log_their_device_and_collectives(tmp_path, monkeypatch):
    monkeypatch.setenv("DP_COURSE_COLLECTIVE_LOG", str(tmp_path))
    assert launch(_one_all_reduce, 2, hang_timeout=30) == [2.0, 2.0]
    devices, rows = gpu_check.collect_log(tmp_path)
    assert devices == {0: ["cpu"], 1: ["cpu"]}
    assert [(r["rank"], r["op"], r["payload_bytes"], r["wire_bytes"]) for r in rows] == \
        [(0, "all_reduce", 40, 40), (1, "all_reduce", 40, 40)] or sorted(r["rank"] for r in rows) == [0, 1]
    assert all(r["op"] == "all_reduce" and r["payload_bytes"] == 40 and r["end"] >= r["start"] for r in rows)


def test_make_has_the_target_and_its_help_line():
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"^gpu-check: setup\n\t\$\(PY\) scripts/gpu_check\.py", makefile, re.M)
    assert "make gpu-check" in makefile and "gpu-check" in re.search(r"^\.PHONY:.*$", makefile, re.M).group()


def test_a_rehearsal_runs_the_capped_sizes_on_gloo_with_the_guard_pretending(tmp_path, monkeypatch):
    import papermill

    seen = []

    def execute_notebook(source, executed, parameters, **options):  # what the kernel would get
        seen.append((pathlib.Path(source).name, parameters, os.environ["DP_COURSE_DEVICE_GUARD"]))

    monkeypatch.setattr(papermill, "execute_notebook", execute_notebook)
    code = gpu_check.main(["--pretend-gpus", "2", "--out", str(tmp_path),
                           "--only", "chapters/00_first_distributed_program.ipynb"])
    assert code == 0
    assert seen == [("00_first_distributed_program.ipynb", {"BACKEND": "gloo", "WORLD_SIZE": 2}, "pretend")]
    report = (tmp_path / "report.md").read_text()
    assert "a rehearsal on the CPU: the world sizes of 2 GPU(s)" in report and "train_gpt" not in report
