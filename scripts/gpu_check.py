"""`make gpu-check`: run every chapter, every lab solution and the capstone on NCCL, and write one report.

    .venv/bin/python scripts/gpu_check.py [--out artifacts/gpu-check] [--only chapters/02_collectives.ipynb ...]

On a machine with 1 to 8 CUDA GPUs each notebook runs under papermill in a fresh kernel with
    BACKEND = "nccl" (where the notebook has the parameter), every *WORLD_SIZE* parameter capped at the GPU
    count (a tuple of world sizes keeps those that fit), DP_COURSE_DEVICE_GUARD=check (a collective on a
    tensor that is not on rank_device() fails, helpers/launcher/device_guard.py), and DP_COURSE_COLLECTIVE_LOG (each
    rank writes the device it computed on and every collective it issued: op, device, bytes, times);
then chapters/capstone/train_gpt.py runs under torchrun on every GPU. The labs' checks stay on Gloo
(helpers/grading/shared_run.py): what runs on the GPUs is the solutions' own cells.
The report, artifacts/gpu-check/report.md, is the one file to send with a bug report: per notebook pass or
fail and the first error, each cell's time, the device each rank saw, the bytes measured per collective.
Without a GPU: one line, exit 0.

    .venv/bin/python scripts/gpu_check.py --pretend-gpus 3 [--only ...]

rehearses on a CPU what a machine with 3 GPUs would run: the same world sizes, on Gloo, with the device guard
pretending (helpers/launcher/device_guard.py). It catches a notebook that breaks at the capped sizes, which CI's
runs at the committed sizes cannot; it was run for 2 and 3 GPUs before a release.
"""
import argparse
import ast
import dataclasses
import datetime
import json
import os
import pathlib
import platform
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
CELL_TIMEOUT_S = 1800
NOTEBOOKS = sorted(ROOT.glob("chapters/*.ipynb")) + sorted(ROOT.glob("solutions/*.ipynb"))
CAPSTONE = ROOT / "chapters" / "capstone" / "train_gpt.py"


@dataclasses.dataclass
class Result:
    """One notebook or script, as the report shows it."""

    name: str
    passed: bool
    seconds: float
    cells: list = dataclasses.field(default_factory=list)  # [(cell index, seconds, "ok" | "error")]
    devices: dict = dataclasses.field(default_factory=dict)  # rank -> sorted devices seen (rank_device, tensors)
    collectives: list = dataclasses.field(default_factory=list)  # JSON rows written by the ranks
    error: str = ""
    parameters: dict = dataclasses.field(default_factory=dict)
    output: str = ""  # the capstone's last lines


def gpu_count():
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def parameters_for(path, gpus):
    """Papermill parameters: NCCL, and world sizes that fit on `gpus` GPUs (from the committed parameters cell).

    NCCL takes one GPU per rank, and some cells launch a fixed 2 ranks (chapter 11's debugging demonstrations,
    chapter 09's load on fewer ranks): on one GPU a notebook keeps its world sizes and BACKEND "auto", which puts
    1-rank launches on the GPU and the others on Gloo, as a student's run on that machine does. Chapter 09's 2-D
    meshes (REPLICAS x WORLD_SIZE // REPLICAS) need both dimensions of 2 or more: with fewer GPUs than that its
    WORLD_SIZE stays and BACKEND is "auto" too."""
    cells = json.loads(pathlib.Path(path).read_text())["cells"]
    source = next(("".join(c["source"]) for c in cells if "parameters" in c.get("metadata", {}).get("tags", [])), "")
    committed = {}
    for node in ast.parse(source).body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            try:
                committed[node.targets[0].id] = ast.literal_eval(node.value)
            except ValueError:
                pass
    if gpus < 2:
        return {"BACKEND": "auto"} if "BACKEND" in committed else {}
    chosen = {"BACKEND": "nccl"} if "BACKEND" in committed else {}
    for name, value in committed.items():
        if "WORLD_SIZE" not in name:
            continue
        if isinstance(value, int):
            chosen[name] = min(value, gpus)
        elif isinstance(value, (tuple, list)) and all(isinstance(v, int) for v in value):
            # a list: papermill writes a tuple parameter into the notebook as the string of the tuple
            chosen[name] = [v for v in value if v <= gpus] or [min(value[0], gpus)]
    replicas, world_size = committed.get("REPLICAS"), chosen.get("WORLD_SIZE")
    if isinstance(replicas, int) and isinstance(world_size, int) and (world_size % replicas
                                                                      or world_size < 2 * replicas):
        # Too few GPUs for a mesh with both dimensions of 2 or more (a shard group of 1 has nothing to gather):
        # the mesh cells keep their world size, on Gloo; what fits on the GPUs still runs there.
        del chosen["WORLD_SIZE"]
        if "BACKEND" in chosen:
            chosen["BACKEND"] = "auto"
    return chosen


def collect_log(directory):
    """(rank -> sorted devices, collective rows) from the ranks' JSON-lines files."""
    devices, rows = {}, []
    for path in sorted(pathlib.Path(directory).glob("*.jsonl")):
        for line in path.read_text().splitlines():
            row = json.loads(line)
            seen = devices.setdefault(row["rank"], set())
            if "rank_device" in row:
                seen.add(row["rank_device"])
            else:
                seen.add(row["device"] or "none")
                rows.append(row)
    return {r: sorted(d) for r, d in sorted(devices.items())}, rows


def run_notebook(path, gpus, out_dir, rehearsal=False):
    """Execute one notebook on NCCL with papermill (rehearsal: on Gloo, the guard pretending); its Result."""
    import papermill

    log = pathlib.Path(tempfile.mkdtemp(prefix="collectives-", dir=out_dir))
    params = parameters_for(path, gpus)
    if rehearsal and "BACKEND" in params:
        params["BACKEND"] = "gloo"
    env = {"DP_COURSE_DEVICE_GUARD": "pretend" if rehearsal else "check", "DP_COURSE_COLLECTIVE_LOG": str(log)}
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)  # the kernel inherits them; its launches pass them on to the ranks
    executed = out_dir / "executed" / path.relative_to(ROOT)
    executed.parent.mkdir(parents=True, exist_ok=True)
    start, error = time.perf_counter(), ""
    try:
        papermill.execute_notebook(str(path), str(executed), parameters=params, kernel_name="python3",
                                   cwd=str(path.parent), progress_bar=False, execution_timeout=CELL_TIMEOUT_S)
    except Exception as exc:  # noqa: BLE001 - one failed notebook must not stop the others
        error = f"{type(exc).__name__}: {exc}"
    finally:
        for k, v in saved.items():
            os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)
    seconds = time.perf_counter() - start
    cells = []
    if executed.exists():
        for i, cell in enumerate(json.loads(executed.read_text())["cells"]):
            meta = cell.get("metadata", {}).get("papermill", {})
            if cell["cell_type"] == "code" and meta.get("duration") is not None:
                cells.append((i, meta["duration"], "error" if meta.get("exception") else "ok"))
    devices, rows = collect_log(log)
    return Result(str(path.relative_to(ROOT)), not error, seconds, cells, devices, rows, error[:3000], params)


def run_capstone(gpus):
    """chapters/capstone/train_gpt.py under torchrun on every GPU; its Result."""
    torchrun = os.path.join(os.path.dirname(sys.executable), "torchrun")
    command = [torchrun, "--standalone", f"--nproc-per-node={gpus}", str(CAPSTONE), "--strategy", "all"]
    start = time.perf_counter()
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=CELL_TIMEOUT_S)
    output = done.stdout + done.stderr
    devices = {}
    for line in output.splitlines():  # rank r's lines name its device when the script prints one
        if line.startswith("rank ") and "cuda:" in line:
            rank = int(line.split()[1].rstrip(":"))
            devices.setdefault(rank, set()).add("cuda:" + line.split("cuda:")[1].split()[0].strip(",)"))
    return Result("chapters/capstone/train_gpt.py (torchrun)", done.returncode == 0, time.perf_counter() - start,
                  devices={r: sorted(d) for r, d in devices.items()},
                  error="" if done.returncode == 0 else f"exit code {done.returncode}",
                  parameters={"command": " ".join(command[1:])}, output="\n".join(output.splitlines()[-40:]))


def machine():
    """What the report says about the machine: GPUs, torch, CUDA, NCCL."""
    import torch

    names = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    nccl = ".".join(map(str, torch.cuda.nccl.version())) if names else "-"
    return {"gpus": len(names), "gpu names": ", ".join(sorted(set(names))) or "-", "torch": torch.__version__,
            "cuda": torch.version.cuda or "-", "nccl": nccl, "python": platform.python_version(),
            "host": platform.node(), "date": datetime.datetime.now().isoformat(timespec="seconds")}


def collective_table(rows):
    """Markdown rows: per rank, op, device and dtype: calls, payload and wire bytes, seconds on the wire."""
    groups = {}
    for row in rows:
        key = (row["rank"], row["op"], row["device"], row["dtype"])
        g = groups.setdefault(key, {"calls": 0, "payload": 0, "wire": 0, "seconds": 0.0, "timed": 0})
        g["calls"] += 1
        g["payload"] += row["payload_bytes"]
        g["wire"] += row["wire_bytes"]
        if row.get("end") is not None:
            g["seconds"] += row["end"] - row["start"]
            g["timed"] += 1
    lines = ["| rank | op | device | dtype | calls | payload bytes | wire bytes | timed calls | seconds |",
             "|---:|---|---|---|---:|---:|---:|---:|---:|"]
    for (rank, op, device, dtype), g in sorted(groups.items(), key=lambda kv: tuple(map(str, kv[0]))):
        lines.append(f"| {rank} | {op} | {device} | {dtype} | {g['calls']} | {g['payload']} | {g['wire']} | "
                     f"{g['timed']} | {g['seconds']:.6f} |")
    return lines


def write_report(results, info, path):
    """The Markdown report: machine, summary table, then per notebook its cells, devices and collectives."""
    passed = sum(r.passed for r in results)
    lines = ["# GPU check", "", "| machine | |", "|---|---|", *[f"| {k} | {v} |" for k, v in info.items()], "",
             f"**{passed} of {len(results)} passed.**", "",
             "| notebook | result | seconds | devices seen, by rank |", "|---|---|---:|---|"]
    for r in results:
        devices = "; ".join(f"[rank {rank}] {', '.join(d)}" for rank, d in r.devices.items()) or "-"
        lines.append(f"| {r.name} | {'pass' if r.passed else 'FAIL'} | {r.seconds:.1f} | {devices} |")
    for r in results:
        lines += ["", f"## {r.name}: {'pass' if r.passed else 'FAIL'} ({r.seconds:.1f} s)", ""]
        if r.parameters:
            lines.append("Parameters: " + ", ".join(f"`{k} = {v!r}`" for k, v in r.parameters.items()))
        if r.error:
            lines += ["", "```", r.error, "```"]
        if r.cells:
            lines += ["", "| cell | seconds | status |", "|---:|---:|---|"]
            lines += [f"| {i} | {s:.2f} | {status} |" for i, s, status in r.cells]
        if r.devices:
            lines += [""] + [f"- `[rank {rank}]` {', '.join(d)}" for rank, d in r.devices.items()]
        if r.collectives:
            lines += ["", *collective_table(r.collectives)]
        if r.output:
            lines += ["", "```", r.output, "```"]
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")
    return path


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(ROOT / "artifacts" / "gpu-check"))
    parser.add_argument("--only", nargs="*", help="notebooks to run (default: every chapter and solution)")
    parser.add_argument("--no-capstone", action="store_true", help="skip the torchrun run of the capstone")
    parser.add_argument("--pretend-gpus", type=int, choices=range(1, 9), metavar="N",
                        help="rehearse on the CPU: the world sizes of N GPUs, on Gloo, the device guard pretending")
    options = parser.parse_args(argv)
    rehearsal = options.pretend_gpus is not None
    gpus = options.pretend_gpus if rehearsal else gpu_count()
    if gpus == 0:
        print("gpu-check: no CUDA GPU on this machine (torch.cuda.is_available() is False); nothing to run")
        return 0
    out = pathlib.Path(options.out)
    out.mkdir(parents=True, exist_ok=True)
    gpus = min(gpus, 8)
    notebooks = [(ROOT / p).resolve() for p in options.only] if options.only else NOTEBOOKS
    results = []
    for path in notebooks:
        results.append(run_notebook(path, gpus, out, rehearsal))
        print(f"{results[-1].name}: {'pass' if results[-1].passed else 'FAIL'} ({results[-1].seconds:.1f} s)",
              flush=True)
    if not (options.no_capstone or rehearsal):  # chapter 10, section 11 runs it on the CPU
        results.append(run_capstone(gpus))
        print(f"{results[-1].name}: {'pass' if results[-1].passed else 'FAIL'}", flush=True)
    info = machine()
    if rehearsal:
        info["note"] = f"a rehearsal on the CPU: the world sizes of {gpus} GPU(s), on Gloo, the device guard pretending"
    elif gpus == 1:
        info["note"] = ("one GPU: NCCL takes one GPU per rank, so launches of 2 or more ranks ran on Gloo "
                        "(BACKEND \"auto\"); the devices column says where each rank computed")
    report = write_report(results, info, out / "report.md")
    print(f"report: {report}")
    return 0 if all(r.passed for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
