"""helpers.launcher.forkserver: one forkserver per process, restarted when a caller needs other modules preloaded."""
import multiprocessing.forkserver
import os
import subprocess
import sys

import pytest

from helpers import launch
from helpers.launch import preload_modules
from helpers.launcher import forkserver, hugepages

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
    assert forkserver.preloaded() == ["json.tool", *preload_modules()]  # worker, torch._dynamo, ..., hugepages
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


def anon_huge_mib(pid):
    """AnonHugePages of a process, in MiB."""
    with open(f"/proc/{pid}/smaps_rollup") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("AnonHugePages:")) // 1024


def collapse_supported():
    """MADV_COLLAPSE: Linux 6.1 or later, transparent huge pages not "never"."""
    try:
        with open("/sys/kernel/mm/transparent_hugepage/enabled") as f:
            enabled = "[never]" not in f.read()
    except OSError:
        return False
    major, minor = (int(x) for x in os.uname().release.split(".")[:2])
    return enabled and (major, minor) >= (6, 1)


def test_only_private_anonymous_memory_is_collapsed_in_whole_huge_pages():
    maps = ["00400000-00a00000 rw-p 00000000 00:00 0 ",                        # 6 MiB, aligned: all of it
            "7f0000100000-7f0000700000 rw-p 00000000 00:00 0 ",                # rounded in: 7f0000200000-600000
            "7f0001000000-7f0001100000 rw-p 00000000 00:00 0 ",                # 1 MiB: no whole huge page
            "7f0002000000-7f0002400000 rw-s 00000000 00:01 7 /dev/shm/x",      # shared
            "7f0003000000-7f0003400000 r--p 00000000 08:01 9 /usr/lib/libc.so",  # read-only, a file
            "7f0004000000-7f0004400000 rw-p 00001000 08:01 9 /usr/lib/libc.so",  # a file's private copy
            "01000000-01400000 rw-p 00000000 00:00 0 [heap]",                   # the heap: yes
            "7ffe00000000-7ffe00400000 rw-p 00000000 00:00 0 [stack]"]          # the stack: no
    assert list(hugepages._private_anonymous(maps)) == [
        (0x400000, 0xA00000), (0x7F0000200000, 0x7F0000600000), (0x1000000, 0x1400000)]


@pytest.mark.skipif(not collapse_supported(), reason="no MADV_COLLAPSE here (Linux < 6.1 or THP 'never')")
def test_the_forkserver_forks_from_huge_pages_once_it_forked_many_ranks():
    for _ in range(hugepages.COLLAPSE_AT_FORK // 4):
        launch(modules_in_rank, 4)
    pid = multiprocessing.forkserver._forkserver._forkserver_pid
    # torch and torch._dynamo: ~190 MiB of private memory, most of it in 2 MiB pages once collapsed.
    assert anon_huge_mib(pid) > 64, f"forkserver {pid}: {anon_huge_mib(pid)} MiB in huge pages"


# By its file, not through the helpers package, whose import brings torch (3.4 CPU-s per subprocess).
LOAD = f"""
import importlib.util
spec = importlib.util.spec_from_file_location("hugepages", {hugepages.__file__!r})
h = importlib.util.module_from_spec(spec)
spec.loader.exec_module(h)
"""
COUNT_FORKS = LOAD + """
import os, sys
buf = bytearray(b"x" * (64 << 20))  # 64 MiB of private memory, written
h.count_forks_here()  # as a forkserver forked from its kernel does (a no-op here: this process imported it)
def huge():
    with open("/proc/self/smaps_rollup") as f:
        return next(int(l.split()[1]) for l in f if l.startswith("AnonHugePages:")) >> 10
seen = []
for _ in range(h.COLLAPSE_AT_FORK):
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
    seen.append(huge())
print(seen)
"""


@pytest.mark.skipif(not collapse_supported(), reason="no MADV_COLLAPSE here (Linux < 6.1 or THP 'never')")
def test_a_process_that_forks_little_never_pays_for_the_collapse():
    out = subprocess.run([sys.executable, "-c", COUNT_FORKS], capture_output=True, text=True, timeout=60)
    seen = eval(out.stdout)  # MiB in huge pages after each fork
    assert seen[:hugepages.COLLAPSE_AT_FORK - 1] == [0] * (hugepages.COLLAPSE_AT_FORK - 1), seen
    assert seen[-1] >= 60, seen


NOT_THE_OWNER = COUNT_FORKS.replace("seen = []", "seen = []\nif os.fork():\n    os._exit(0)  # go on in a child")


@pytest.mark.skipif(not collapse_supported(), reason="no MADV_COLLAPSE here (Linux < 6.1 or THP 'never')")
def test_a_child_forking_on_its_own_never_collapses():
    # A fork bomb's 64 copies of a kernel would otherwise pay the collapse in every copy.
    out = subprocess.run([sys.executable, "-c", NOT_THE_OWNER.replace("h.count_forks_here()", "")],
                         capture_output=True, text=True, timeout=60)
    assert eval(out.stdout) == [0] * hugepages.COLLAPSE_AT_FORK, out.stdout + out.stderr


def test_turned_off_or_unsupported_it_does_nothing():
    code = LOAD + "print(h.collapse())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                         env={**os.environ, "DP_COURSE_HUGEPAGES": "0"})
    assert out.stdout.strip() == "0", out.stderr
    unsupported = LOAD + ("import builtins\n"
                          "def no_proc(*a, **k): raise FileNotFoundError('/proc/self/maps')\n"
                          "builtins.open = no_proc\nprint(h.collapse())")
    out = subprocess.run([sys.executable, "-c", unsupported], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "0", out.stderr
