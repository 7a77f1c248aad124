"""How long a student waits for a lab's first multi-rank check, in a real Jupyter kernel.

    python -m tests.bench_first_check [--pause 10]

Starts a kernel, runs lab 03's imports cell (which imports check and, in a kernel, starts the ranks' forkserver),
defines the solution's answers, pauses (the student reading and writing), then times check("3.2"), the lab's
first multi-rank check, and check("3.3") after it. --pause 0 is the worst case: the check right after the imports.
"""
import argparse
import time

from jupyter_client.manager import start_new_kernel

SETUP = """
from tests import lab_solution
from helpers.grading.labgen import ROOT
_ns = lab_solution.definitions(ROOT / "solutions" / "03_manual_ddp.ipynb")
globals().update({k: v for k, v in _ns.items() if not k.startswith("__")})
"""


def run(client, code, timeout=300):
    """Execute code; return the seconds until the kernel is idle again, and the stdout text."""
    start = time.monotonic()
    msg_id = client.execute(code)
    out = []
    while True:
        msg = client.get_iopub_msg(timeout=timeout)
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        if msg["msg_type"] == "stream":
            out.append(msg["content"]["text"])
        if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
            return time.monotonic() - start, "".join(out)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pause", type=float, default=10.0, help="seconds between the imports and the check")
    options = parser.parse_args()
    manager, client = start_new_kernel(kernel_name="python3")
    try:
        imports, _ = run(client, "from helpers.grading import check")
        run(client, SETUP)
        time.sleep(options.pause)
        first, out = run(client, 'check("3.2", globals())')
        assert "4/4 public checks passed" in out, out
        second, out = run(client, 'check("3.3", globals())')
        assert "5/5 public checks passed" in out, out
        print(f"imports cell {imports:.1f} s; after a {options.pause:g} s pause: first multi-rank check (3.2) "
              f"{first:.1f} s, the next one (3.3) {second:.1f} s")
    finally:
        client.stop_channels()
        manager.shutdown_kernel(now=True)


if __name__ == "__main__":
    main()
