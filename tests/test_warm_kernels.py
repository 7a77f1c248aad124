"""The tests' warm kernels (tests/warm_kernels.py) behave as kernels started the usual way, and cost less."""
import os
import signal
import subprocess
import sys
import time

import pytest
from jupyter_client.manager import start_new_kernel

from helpers.launch import preload_modules
from tests import warm_kernels

pytestmark = pytest.mark.timeout(240)


@pytest.fixture(scope="module")
def kernel(tmp_path_factory):
    warm_kernels.install_kernelspec()
    warm_kernels.register_provisioner()
    cwd = tmp_path_factory.mktemp("cwd")
    os.environ["DP_COURSE_WARM_TEST"] = "from the test"
    try:
        manager, client = start_new_kernel(kernel_name=warm_kernels.WARM_KERNEL, cwd=str(cwd), startup_timeout=180)
    finally:
        os.environ.pop("DP_COURSE_WARM_TEST")
    yield manager, client, cwd
    client.stop_channels()
    manager.shutdown_kernel(now=True)


def run(client, code, timeout=60):
    """(stdout text, error name or None) of code run in the kernel."""
    out, error = [], []

    def hook(message):
        content = message["content"]
        if message["msg_type"] == "stream":
            out.append(content["text"])
        elif message["msg_type"] == "error":
            error.append(content["ename"])

    client.execute_interactive(code, timeout=timeout, output_hook=hook)
    return "".join(out), (error or [None])[0]


def test_it_runs_where_and_with_what_the_manager_asked(kernel):
    manager, client, cwd = kernel
    out, error = run(client, "import os, sys\nprint(os.getcwd(), os.environ.get('DP_COURSE_WARM_TEST'), "
                             "os.getpgid(0) == os.getpid(), sys.argv[0].endswith('ipykernel_launcher.py'))")
    assert error is None and out.split() == [str(cwd), "from", "the", "test", "True", "True"], out
    assert manager.provisioner.pid == int(run(client, "print(os.getpid())")[0])


def test_its_forkserver_was_forked_before_the_first_launch(kernel):
    _, client, _ = kernel
    code = ("import multiprocessing.forkserver as f, os, torch\n"
            "server = f._forkserver\n"
            "print(server._forkserver_pid is not None, server._preload_modules, os.waitpid(server._forkserver_pid, "
            "os.WNOHANG) == (0, 0))\n"
            "from helpers import launch\n"
            "before = server._forkserver_pid\n"
            "print(launch(lambda: __import__('os').getppid(), 2) == [before, before])")
    out, error = run(client, code)
    assert error is None, out
    assert out.splitlines() == [f"True {preload_modules()} True", "True"], out  # DP_COURSE_PRELOAD's too


def test_an_interrupt_reaches_the_cell(kernel):
    manager, client, _ = kernel
    msg_id = client.execute("import time\nprint('running', flush=True)\nfor _ in range(600): time.sleep(0.1)")
    # Interrupt once the loop runs: a SIGINT that comes before the cell starts is not this test's subject (a fixed
    # sleep here lost that race under load).
    while True:
        message = client.get_iopub_msg(timeout=60)
        if message["parent_header"].get("msg_id") == msg_id and message["msg_type"] == "stream":
            break
    manager.interrupt_kernel()
    reply = client.get_shell_msg(timeout=60)
    assert reply["content"]["status"] == "error" and reply["content"]["ename"] == "KeyboardInterrupt", reply["content"]
    # Still usable: the next cell runs and its reply carries its value. (The reply, not the stream output: in one
    # CI run under load the next cell's printed "42" did not reach the client before its idle status.)
    reply = client.execute_interactive("answer = 6 * 7", user_expressions={"answer": "answer"}, timeout=60)
    assert reply["content"]["status"] == "ok", reply["content"]
    assert reply["content"]["user_expressions"]["answer"]["data"]["text/plain"] == "42"


def test_a_killed_kernel_is_seen_dead_with_its_signal():
    warm_kernels.install_kernelspec()
    warm_kernels.register_provisioner()
    manager, client = start_new_kernel(kernel_name=warm_kernels.WARM_KERNEL, startup_timeout=180)
    client.stop_channels()
    os.kill(manager.provisioner.pid, signal.SIGKILL)
    deadline = time.monotonic() + 30
    while manager.is_alive() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not manager.is_alive()
    assert manager.provisioner.process.returncode == -signal.SIGKILL
    manager.cleanup_resources()


FORKED = """
import multiprocessing.forkserver, sys
from helpers import launch
from helpers.launcher import forkserver

from helpers.launch import start_forkserver_by_fork
if __name__ == "__main__":
    assert start_forkserver_by_fork(), "declined"
    pid = multiprocessing.forkserver._forkserver._forkserver_pid
    assert not start_forkserver_by_fork(), "a second start must decline: one forkserver per process"
    assert launch(lambda: __import__("os").getppid(), 2) == [pid, pid], "the ranks come from another forkserver"
    assert multiprocessing.forkserver._forkserver._forkserver_pid == pid
    print("ok", pid)
"""


def test_start_by_fork_serves_launch_and_stops_with_its_process(tmp_path):
    script = tmp_path / "forked.py"
    script.write_text(FORKED)
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=180)
    assert done.returncode == 0 and done.stdout.split()[0] == "ok", done.stderr[-3000:]
    pid = int(done.stdout.split()[1])
    deadline = time.monotonic() + 20  # it sees the "alive" pipe close when the script exits
    while os.path.exists(f"/proc/{pid}") and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not os.path.exists(f"/proc/{pid}"), "the forked forkserver outlived its process"
