"""%%ranks in a real Jupyter kernel: live output, interrupting a hung cell, nothing left behind."""
import queue
import re
import time

import pytest
from jupyter_client.manager import start_new_kernel

from tests.processes import children_of, fresh_interpreter_env

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def kernel():
    manager, client = start_new_kernel(kernel_name="python3", env=fresh_interpreter_env())
    yield manager, client
    client.stop_channels()
    manager.shutdown_kernel(now=True)


def execute(client, code, timeout=60.0):
    """Run code; return (status, stdout text, stderr text, error name)."""
    msg_id = client.execute(code)
    stdout, stderr, error = [], [], None
    deadline = time.monotonic() + timeout
    while True:
        msg = client.get_iopub_msg(timeout=max(0.1, deadline - time.monotonic()))
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        kind, content = msg["msg_type"], msg["content"]
        if kind == "stream":
            (stdout if content["name"] == "stdout" else stderr).append(content["text"])
        elif kind == "error":
            error = content["ename"]
        elif kind == "status" and content["execution_state"] == "idle":
            break
    reply = shell_reply(client, msg_id)
    return reply["content"]["status"], "".join(stdout), "".join(stderr), error


def shell_reply(client, msg_id, timeout=10.0):
    """The shell reply to msg_id. Replies to earlier requests are skipped: start_new_kernel may leave a
    second kernel_info_reply on a slow machine, and a failed test may leave its reply unread."""
    deadline = time.monotonic() + timeout
    while True:
        reply = client.get_shell_msg(timeout=max(0.1, deadline - time.monotonic()))
        if reply["parent_header"].get("msg_id") == msg_id:
            return reply


def drain_iopub(client, msg_id):
    """What the kernel published for msg_id and has not been read yet: the story of a failure."""
    texts = []
    while True:
        try:
            msg = client.get_iopub_msg(timeout=1)
        except queue.Empty:
            return texts
        if msg["parent_header"].get("msg_id") == msg_id and msg["msg_type"] in ("stream", "error"):
            texts.append(msg["content"].get("text") or msg["content"].get("ename"))


def descendants(pid):
    """Every live process below pid (the forkserver and its workers)."""
    found, todo = [], [pid]
    while todo:
        children = children_of(todo.pop())
        found += children
        todo += children
    return found


def test_import_starts_the_forkserver_before_torch(kernel):
    """`import helpers` in a kernel starts the ranks' forkserver first: its module imports no torch, so the
    forkserver imports torch on the other core while the kernel does (tests/bench_first_check.py times it)."""
    _, client = kernel
    # An import hook notes whether the forkserver runs when this kernel first imports torch.
    cell = ("import sys, multiprocessing.forkserver as mpf\nclass Spy:\n    seen = None\n"
            "    def find_spec(self, name, path=None, target=None):\n"
            "        if name == 'torch' and Spy.seen is None:\n"
            "            Spy.seen = mpf._forkserver._forkserver_pid is not None\n"
            "sys.meta_path.insert(0, Spy())\nprint('torch' in sys.modules)\nimport helpers\nprint(Spy.seen)")
    status, out, err, error = execute(client, cell)
    assert status == "ok", (out, err, error)
    assert out.split() == ["False", "True"], f"torch imported before helpers, forkserver up at torch's import: {out}"


def test_ranks_cell_in_kernel(kernel):
    _, client = kernel
    status, out, err, error = execute(client, "%load_ext helpers")
    assert status == "ok", (out, err, error)
    cell = "%%ranks 4\nimport torch.distributed as dist\nprint('hello from', dist.get_rank())"
    status, out, err, _ = execute(client, cell)
    assert status == "ok", (out, err)
    for rank in range(4):
        assert f"[rank {rank}] hello from {rank}" in out


def test_interrupt_hung_cell_then_next_cell_works(kernel):
    manager, client = kernel
    execute(client, "%load_ext helpers")
    kernel_pid = manager.provisioner.process.pid
    # Rank 1 sleeps rather than returns: a returned rank would make this a deadlock reported at once.
    cell = ("%%ranks 2 --hang-timeout 60\nimport torch.distributed as dist, os, time\n"
            "print('pid', os.getpid(), flush=True)\nif dist.get_rank() == 0:\n    dist.barrier()\n"
            "time.sleep(60)\n")
    msg_id = client.execute(cell)
    workers, seen = [], []
    deadline = time.monotonic() + 30
    while len(workers) < 2 and time.monotonic() < deadline:  # wait until both ranks are running
        try:
            msg = client.get_iopub_msg(timeout=1)
        except queue.Empty:
            continue
        if msg["parent_header"].get("msg_id") == msg_id and msg["msg_type"] == "stream":
            seen.append(msg["content"]["text"])
            # Only "[rank r] pid N" lines: a warning a rank prints may hold numbers too.
            workers += [int(pid) for pid in re.findall(r"^\[rank \d\] pid (\d+)$", seen[-1], re.M)]
    assert len(workers) == 2, seen
    time.sleep(0.5)
    manager.interrupt_kernel()
    interrupted = time.monotonic()
    reply = shell_reply(client, msg_id, timeout=20)
    assert reply["content"]["status"] == "error" and reply["content"]["ename"] == "KeyboardInterrupt", (
        reply["content"], seen, drain_iopub(client, msg_id))
    # The interrupt's report, without the launcher's frames.
    assert reply["content"]["traceback"][0].startswith("KeyboardInterrupt: interrupted while the ranks"), reply
    assert "helpers/" not in "\n".join(reply["content"]["traceback"]), reply["content"]["traceback"]
    while set(workers) & set(descendants(kernel_pid)) and time.monotonic() - interrupted < 2.0:
        time.sleep(0.05)
    assert not set(workers) & set(descendants(kernel_pid)), "workers survived the interrupt"
    status, out, _, _ = execute(client, "%%ranks 2\nprint('again')")
    assert status == "ok" and "[rank 1] again" in out
    # Only the forkserver (and its resource tracker) may remain below the kernel, no workers.
    time.sleep(0.3)
    forkserver_level = children_of(kernel_pid)
    assert all(children_of(p) == [] for p in forkserver_level)


def test_hang_report_names_the_notebook_cell(kernel):
    _, client = kernel
    cell = ("from helpers import launch, CollectiveHang\n"
            "def only_rank_zero_waits():\n"
            "    import torch.distributed as dist\n"
            "    if dist.get_rank() == 0:\n"
            "        dist.barrier()\n"
            "try:\n"
            "    launch(only_rank_zero_waits, 2, hang_timeout=2)\n"
            "except CollectiveHang as e:\n"
            "    print(e)\n")
    status, out, err, error = execute(client, cell)
    assert status == "ok", (error, out, err)
    assert "rank 0: blocked in barrier #1, called at In [" in out
    assert "line 5, in only_rank_zero_waits: dist.barrier()" in out


def execute_for_error(client, code, timeout=60.0):
    """Run code; return (execution count, the error's traceback text, what it wrote to stdout)."""
    msg_id = client.execute(code)
    traceback, stdout = None, []
    deadline = time.monotonic() + timeout
    while True:
        msg = client.get_iopub_msg(timeout=max(0.1, deadline - time.monotonic()))
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        if msg["msg_type"] == "error":
            traceback = "\n".join(msg["content"]["traceback"])
        elif msg["msg_type"] == "stream":
            stdout.append(msg["content"]["text"])
        elif msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
            break
    reply = shell_reply(client, msg_id)
    return reply["content"]["execution_count"], traceback, "".join(stdout)


def test_ranks_hang_shows_the_report_in_the_cells_own_terms(kernel):
    _, client = kernel
    execute(client, "%load_ext helpers")
    # Line 5 as the cell shows it (the %%ranks line is line 1); rank 1 returns, so this is a deadlock at once.
    cell = ("%%ranks 2 --hang-timeout 30\nimport torch.distributed as dist\n\nif dist.get_rank() == 0:\n"
            "    dist.barrier()\n")
    start = time.monotonic()
    count, traceback, _ = execute_for_error(client, cell)
    assert time.monotonic() - start < 10, "the deadlock waited for the timeout"
    assert traceback is not None, "the cell did not fail"
    assert traceback.startswith("CollectiveHang: deadlock: rank 1 returned"), traceback
    assert f"rank 0: blocked in barrier #1, called at In [{count}], line 5" in traceback, traceback
    assert "helpers/" not in traceback and "site-packages" not in traceback, traceback
    assert max(len(line) for line in traceback.splitlines()) <= 88, traceback
    # The full traceback on request: the launcher's frames are there.
    _, full, out = execute_for_error(client, "%tb")
    assert "helpers/launcher/run.py" in (full or "") + out, (full, out)



def test_slow_ranks_cell_shows_live_progress_then_clears_it(kernel):
    _, client = kernel
    execute(client, "%load_ext helpers")
    cell = ("%%ranks 2\nimport time, torch.distributed as dist\nif dist.get_rank() == 1:\n    time.sleep(4)\n"
            "dist.barrier()\nprint('through')\n")
    msg_id = client.execute(cell)
    shown, stdout = [], []
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        msg = client.get_iopub_msg(timeout=60)
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        if msg["msg_type"] in ("display_data", "update_display_data"):
            shown.append((time.monotonic(), msg["content"]["data"].get("text/plain")))
        elif msg["msg_type"] == "stream":
            stdout.append(msg["content"]["text"])
        elif msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
            break
    shell_reply(client, msg_id)
    texts = [text for _, text in shown]
    assert any(t.startswith("running 2 ranks") and "rank 0 waits in barrier #1" in t and "waiting for rank 1 since"
               in t for t in texts), texts
    assert texts[-1] == "", f"the progress line stayed after the run: {texts}"
    assert "[rank 1] through" in "".join(stdout)


def test_fast_ranks_cell_shows_no_progress_line(kernel):
    _, client = kernel
    msg_id = client.execute("%%ranks 2\nprint('quick')")
    kinds = []
    while True:
        msg = client.get_iopub_msg(timeout=60)
        if msg["parent_header"].get("msg_id") == msg_id:
            kinds.append(msg["msg_type"])
            if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
                break
    shell_reply(client, msg_id)
    assert "display_data" not in kinds, kinds


def test_a_shutdown_after_ranks_ends_the_kernel_by_itself(kernel):
    """Last in this file: it shuts the module's kernel down, as JupyterLab's restart does.

    ipykernel's shutdown sends SIGTERM to each child in the kernel's process group and waits, up to 14 s, for none
    to be left. multiprocessing's resource tracker ignores SIGTERM and the killed forkserver stayed a zombie, so a
    kernel that had run ranks never ended by itself (measured: still there after 20 s): every restart waited
    Jupyter's shutdown_wait_time, 5 s, then killed it. helpers.launcher.forkserver now keeps both out of the way.
    """
    manager, client = kernel
    status, out, _, _ = execute(client, "import os, multiprocessing.resource_tracker as tracker\n"
                                        "from helpers import launch\nlaunch(os.getpid, 2)\n"
                                        "print(os.getpgid(tracker._resource_tracker._pid) != os.getpgrp(), "
                                        "get_ipython().kernel.do_shutdown.stops_forkserver)")
    assert status == "ok" and out.split()[-2:] == ["True", "True"], out
    start = time.monotonic()
    manager.request_shutdown()
    while manager.is_alive() and time.monotonic() - start < 12:
        time.sleep(0.05)
    assert not manager.is_alive(), "the kernel was still running 12 s after a shutdown request"
