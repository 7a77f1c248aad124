"""helpers.launcher.forkserver: one forkserver per process, restarted when a caller needs other modules preloaded."""
import multiprocessing.forkserver
import subprocess
import sys

import pytest

from helpers import launch
from helpers.launcher import forkserver

pytestmark = pytest.mark.timeout(120)


def modules_in_rank():
    return sorted(m for m in ("torch._dynamo", "helpers.launcher.worker", "json.tool") if m in sys.modules)


def test_the_private_api_it_relies_on_still_exists():
    # If a Python release renames these, ensure_running falls back to the first preload: this test says so.
    server = multiprocessing.forkserver._forkserver
    assert all(hasattr(server, a) for a in ("_forkserver_pid", "_preload_modules", "_stop"))
    assert forkserver._server() is server


def test_a_forkserver_started_by_another_caller_is_replaced_for_the_ranks():
    # As the class grader does in the same process: its forkserver lacks torch._dynamo and helpers.launcher.worker.
    forkserver._server()._stop()
    forkserver.ensure_running(["json.tool"])
    assert forkserver.preloaded() == ["json.tool"]
    assert launch(modules_in_rank, 1) == [["helpers.launcher.worker", "json.tool", "torch._dynamo"]]
    assert forkserver.preloaded() == ["json.tool", "helpers.launcher.worker", "torch._dynamo"]
    # ... and then the grader again: everything it needs is there, so the same forkserver serves it
    pid = multiprocessing.forkserver._forkserver._forkserver_pid
    forkserver.ensure_running(["json.tool"])
    assert multiprocessing.forkserver._forkserver._forkserver_pid == pid


def test_the_same_preload_keeps_the_running_forkserver():
    launch(modules_in_rank, 1)
    pid = multiprocessing.forkserver._forkserver._forkserver_pid
    forkserver.ensure_running(["helpers.launcher.worker", "torch._dynamo"])
    assert multiprocessing.forkserver._forkserver._forkserver_pid == pid


@pytest.mark.timeout(60)
def test_a_forkserver_started_by_fork_leaves_the_callers_process_group():
    # A kernel's shutdown signals and waits for every child in its group (tests/test_kernel.py, the last test).
    code = ("import os, multiprocessing.forkserver as mf\nfrom helpers.launcher import forkserver\n"
            "assert forkserver.start_by_fork([])\n"
            "print(os.getpgid(mf._forkserver._forkserver_pid) != os.getpgrp())")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=50)
    assert done.stdout.split() == ["True"], done.stderr
