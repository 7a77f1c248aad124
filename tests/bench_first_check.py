"""How long a student waits for a lab's first multi-rank check, in a fresh Jupyter kernel.

    python -m tests.bench_first_check [--pause 0 10] [--repeats 3]

For each pause and repeat: starts a kernel (the usual `python3` one, as `make lab` gives a student), runs lab 03's
cells up to its first question as a student does (the install cell, the parameters, the imports: `import helpers`
starts the ranks' forkserver in the background), defines the solution's answers, waits `pause` seconds (the student
reading and writing; 0 is "Run All"), then times check("3.2"), the lab's first multi-rank check, and check("3.3").
Prints every run and the medians. The kernel's own start is not counted: JupyterLab starts it when the notebook opens.
"""
import argparse
import json
import pathlib
import statistics
import time

from jupyter_client.manager import start_new_kernel

ROOT = pathlib.Path(__file__).resolve().parent.parent
LAB = ROOT / "labs" / "03_manual_ddp.ipynb"
ANSWERS = """
import sys
sys.path.insert(0, str(ROOT))
from tests import lab_solution
_ns = lab_solution.definitions(ROOT / "solutions" / "03_manual_ddp.ipynb")
globals().update({k: v for k, v in _ns.items() if not k.startswith("__")})
"""


def first_cells(path):
    """The code cells of a lab before its first question's markdown: install cell, parameters, imports."""
    cells = json.loads(path.read_text())["cells"]
    first_question = next(i for i, c in enumerate(cells) if c["cell_type"] == "markdown"
                          and "".join(c["source"]).startswith("## 3.1"))
    return ["".join(c["source"]) for c in cells[:first_question] if c["cell_type"] == "code"]


def run(client, code, timeout=300):
    """Execute code; return the seconds until the kernel is idle again, and the stdout text."""
    start = time.monotonic()
    msg_id = client.execute(code)
    out = []
    while True:
        msg = client.get_iopub_msg(timeout=timeout)
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        if msg["msg_type"] in ("stream", "error"):
            out.append(msg["content"].get("text") or "\n".join(msg["content"].get("traceback", [])))
        if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
            return time.monotonic() - start, "".join(out)


def one_run(pause):
    """(seconds of the cells before question 3.1, of check 3.2, of check 3.3) in a fresh kernel."""
    manager, client = start_new_kernel(kernel_name="python3", cwd=str(LAB.parent))
    try:
        setup = sum(run(client, cell)[0] for cell in first_cells(LAB))
        _, out = run(client, f"ROOT = __import__('pathlib').Path({str(ROOT)!r})\n{ANSWERS}")
        assert not out, out  # the answers defined, silently
        time.sleep(pause)
        first, out = run(client, 'check("3.2", globals())')
        assert "4/4 public checks passed" in out, out
        second, out = run(client, 'check("3.3", globals())')
        assert "5/5 public checks passed" in out, out
        return setup, first, second
    finally:
        client.stop_channels()
        manager.shutdown_kernel(now=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pause", type=float, nargs="+", default=[0.0, 10.0],
                        help="seconds between the imports and the check (0: Run All)")
    parser.add_argument("--repeats", type=int, default=3, help="fresh kernels per pause")
    options = parser.parse_args()
    for pause in options.pause:
        runs = [one_run(pause) for _ in range(options.repeats)]
        for setup, first, second in runs:
            print(f"pause {pause:g} s: cells before 3.1 {setup:.1f} s, first multi-rank check (3.2) {first:.2f} s, "
                  f"the next (3.3) {second:.2f} s")
        medians = [statistics.median(r[i] for r in runs) for i in range(3)]
        print(f"pause {pause:g} s, median of {len(runs)}: cells before 3.1 {medians[0]:.1f} s, first check "
              f"{medians[1]:.2f} s, next {medians[2]:.2f} s")


if __name__ == "__main__":
    main()
