"""pytest plugin (make test loads it with -p): notebooks run in kernels forked from a warm zygote.

Started the usual way, a kernel costs about 10 s of CPU on the 2-core CI machine before its first cell does
anything: an interpreter importing torch and ipykernel, then the launcher's forkserver, a second interpreter
importing torch and torch._dynamo. make test runs about 40 notebooks, so that was a third of its CPU time.
Here a kernel is a fork of tests/kernel_zygote.py (one per pytest worker, torch already imported), and its
forkserver a fork of the kernel before its threads start (helpers.launcher.forkserver.start_by_fork).

How it plugs in: a kernelspec WARM_KERNEL (argv as python3's) whose jupyter_client kernel provisioner,
WarmProvisioner, is LocalProvisioner with the Popen replaced by ZygoteProcess, which has Popen's methods. nbval
(--nbval-kernel-name in the Makefile) and tests/test_labs.py (papermill, kernel_name()) use it, and the browser
test's JupyterLab (its python3 kernelspec names the provisioner: tests/browser_lab.py); the tests of the real
start-up path (tests/test_kernel.py, make lab, the grader's sandboxed kernels) do not.
"""
import atexit
import json
import os
import pathlib
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from importlib.metadata import EntryPoint

from jupyter_client.provisioning import KernelProvisionerFactory
from jupyter_client.provisioning.local_provisioner import LocalProvisioner

# Loaded with -p, this module is imported before nbval, which imports nbformat, which imports jsonschema, which
# imports rfc3987_syntax where it is installed (jupyter_events asks for it): that builds an Earley parser for IRIs,
# 2.2 s of CPU in each pytest process (make test has three), for a format no schema here uses (nbformat validates
# without a format checker). Without it, jsonschema leaves "iri" unchecked. The zygote does the same.
sys.modules.setdefault("rfc3987_syntax", None)

WARM_KERNEL = "python3-warm"
PROVISIONER = "dp-course-zygote"
ZYGOTE = pathlib.Path(__file__).with_name("kernel_zygote.py")
SOCKET_ENV = "DP_COURSE_ZYGOTE_SOCKET"  # set: fork kernels from the zygote listening there, start none
START_TIMEOUT_S = 120.0  # the zygote imports torch: ~6 s alone, much longer next to a busy test worker
# What the ranks of make test's launches import beyond the launcher's preload: a check's rank function is pickled by
# reference, so each rank imported its lab's checks package and helpers.grading (~40 ms); ZeroRedundancyOptimizer's
# ranks torch.distributed.optim (8 TorchScript compiles, ~0.5 s). The zygote and this worker's forkserver import
# them once instead (~0.9 s each; DP_COURSE_PRELOAD, below), so every rank forked below them has them. Ranks do the
# same work either way.
# The grader's probe runtime (for tests/grading's ranks) only where it is: the student release leaves it out
# (helpers/grading/prepare/release.py), and a preload of a module that is not there fails every kernel.
GRADING = pathlib.Path(__file__).resolve().parents[1] / "helpers" / "grading"
RANK_IMPORTS = ["helpers.grading", *["helpers.grading.run.probe_runtime"] * (GRADING / "probe_runtime.py").is_file(),
                "torch.distributed.optim", "torch.distributed.checkpoint",
                *sorted(f"helpers.grading.checks.{d.name}" for d in (GRADING / "checks").glob("lab*"))]


class ZygoteProcess:
    """What LocalProvisioner needs of a Popen, for a kernel the zygote forked (not our child: no waitpid)."""

    stdin = stdout = stderr = None

    def __init__(self, conn, pid):
        self.conn, self.pid, self.returncode = conn, pid, None
        self._buffer = b""

    def poll(self):
        if self.returncode is None and select.select([self.conn], [], [], 0)[0]:
            self._read()
        return self.returncode

    def wait(self, timeout=None):
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise subprocess.TimeoutExpired(f"kernel {self.pid}", timeout)
            select.select([self.conn], [], [], left)
        return self.returncode

    def _read(self):
        piece = self.conn.recv(4096)
        self._buffer += piece
        if b"\n" in self._buffer:
            self.returncode = json.loads(self._buffer.split(b"\n")[0])["exit"]
        elif not piece:
            self.returncode = -signal.SIGKILL  # the zygote died, and the kernel with it (kill_session)
        if self.returncode is not None:
            self.conn.close()

    def send_signal(self, signum):
        if self.poll() is None:  # never signal a pid that may have been reused
            os.kill(self.pid, signum)

    def kill(self):
        self.send_signal(signal.SIGKILL)

    def terminate(self):
        self.send_signal(signal.SIGTERM)


class Zygote:
    """The pytest worker's zygote process: started once, ended when the worker exits (its stdin closes).

    Given the socket of a running zygote instead, a client of that one: how the browser test's JupyterLab server
    (another process, SOCKET_ENV in its environment) starts its kernels from the worker's zygote.
    """

    def __init__(self, path=None):
        if path:
            self.dir, self.path, self.process = None, path, None
            return
        self.dir = tempfile.mkdtemp(prefix="dp-zygote-", dir="/tmp")  # short: AF_UNIX paths hold ~107 bytes
        self.path = os.path.join(self.dir, "socket")
        self.process = subprocess.Popen([sys.executable, str(ZYGOTE), self.path], stdin=subprocess.PIPE,
                                        start_new_session=True)
        atexit.register(self.stop)

    def connect(self):
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            if self.process is not None and self.process.poll() is not None:
                raise RuntimeError(f"the kernel zygote exited with code {self.process.returncode}: see its stderr")
            try:
                conn = socket.socket(socket.AF_UNIX)
                conn.connect(self.path)
                return conn
            except (FileNotFoundError, ConnectionRefusedError):
                conn.close()
                if time.monotonic() > deadline:
                    raise TimeoutError(f"the kernel zygote did not listen within {START_TIMEOUT_S:.0f} s") from None
                time.sleep(0.1)

    def start(self, argv, env, cwd, stdout=None, stderr=None):
        """Fork a kernel: a ZygoteProcess for it."""
        conn = self.connect()
        fds = [f if isinstance(f, int) else f.fileno() for f in (stdout, stderr) if f is not None]
        if len(fds) == 1:  # one given: the other goes where this process's goes, as with Popen
            fds = [fds[0], sys.stderr.fileno()] if stdout is not None else [sys.stdout.fileno(), fds[0]]
        request = json.dumps({"argv": argv, "env": env, "cwd": str(cwd)}).encode()
        socket.send_fds(conn, [len(request).to_bytes(8, "big")], fds)
        conn.sendall(request)
        reply = b""
        while b"\n" not in reply:
            piece = conn.recv(4096)
            if not piece:
                raise RuntimeError("the kernel zygote could not start a kernel: see its stderr")
            reply += piece
        return ZygoteProcess(conn, json.loads(reply.split(b"\n")[0])["pid"])

    def stop(self):
        if self.process is not None and self.process.poll() is None:
            self.process.stdin.close()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()


_zygote = None
_lock = threading.Lock()


def zygote():
    global _zygote
    with _lock:
        if _zygote is None:
            _zygote = Zygote(os.environ.get(SOCKET_ENV))
        return _zygote


class WarmProvisioner(LocalProvisioner):
    """LocalProvisioner, except that the kernel is forked by the zygote instead of started by Popen."""

    async def launch_kernel(self, cmd, **kwargs):
        env = dict(kwargs.get("env") or os.environ)
        env["JPY_PARENT_PID"] = str(os.getpid())  # as jupyter_client's launch_kernel sets it
        cwd = kwargs.get("cwd") or os.getcwd()
        self.process = zygote().start(cmd, env, cwd, kwargs.get("stdout"), kwargs.get("stderr"))
        self.pid = self.pgid = self.process.pid  # it leads its own session, as with start_new_session=True
        self.cwd = cwd
        return self.connection_info


def install_kernelspec():
    """WARM_KERNEL in a kernels directory of our own, first on JUPYTER_PATH (inherited by the kernels too); its path."""
    root = tempfile.mkdtemp(prefix="dp-kernels-")
    spec = pathlib.Path(root, "kernels", WARM_KERNEL)
    spec.mkdir(parents=True)
    (spec / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "Python 3 (forked from a warm zygote, tests only)", "language": "python",
        "metadata": {"kernel_provisioner": {"provisioner_name": PROVISIONER}}}))
    os.environ["JUPYTER_PATH"] = os.pathsep.join(p for p in (root, os.environ.get("JUPYTER_PATH")) if p)
    return root


def register_provisioner():
    KernelProvisionerFactory.provisioners[PROVISIONER] = EntryPoint(
        name=PROVISIONER, value=f"{__name__}:WarmProvisioner", group=KernelProvisionerFactory.GROUP_NAME)


_installed = False
_kernelspec_dir = None


def kernel_name():
    """WARM_KERNEL where this plugin is loaded (make test), else the usual python3."""
    return WARM_KERNEL if _installed else "python3"


def pytest_configure(config):
    global _installed, _kernelspec_dir
    # Read by helpers.launch.preload_modules: in this process's forkserver (the check tests, test_mistakes) and in
    # the kernels' (forks of the zygote, which imports the same list).
    os.environ["DP_COURSE_PRELOAD"] = ",".join(RANK_IMPORTS)
    _kernelspec_dir = install_kernelspec()
    register_provisioner()
    _installed = True
    if os.environ.get("PYTEST_XDIST_WORKER") or not getattr(config.option, "numprocesses", None):
        zygote()  # start importing now, while the first tests run


def pytest_unconfigure(config):
    # Each pytest process made one: without this, a session left hundreds in /tmp, and a hostile test's glob over
    # /tmp (tests/grading/hostile.py FIND_SOLUTION) walks every one of them.
    if _kernelspec_dir:
        shutil.rmtree(_kernelspec_dir, ignore_errors=True)
