"""multiprocessing's forkserver, started with the modules its caller needs.

A process has one forkserver, and its preload is fixed when it starts. The launcher wants torch, torch._dynamo
and helpers.launcher.worker in it; the class grader wants its grading modules. A process that uses both (the test suite,
a notebook that grades) otherwise keeps whichever started first: ranks forked from the grader's forkserver then
import torch._dynamo in every rank (measured: lab 05's check tests 27 s alone, 187 s after a grading test in the
same pytest process). So a preload that lacks a requested module restarts the forkserver, with both lists.

start_by_fork() starts it as a fork of the caller instead of a new interpreter, for a kernel launcher that has
imported the preload already and started no thread yet: the forkserver then costs no second torch import.
"""
import importlib
import inspect
import multiprocessing.connection
import multiprocessing.forkserver
import multiprocessing.process
import multiprocessing.resource_tracker
import multiprocessing.spawn
import multiprocessing.util
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading

from helpers.launcher import hugepages


def _server():
    """multiprocessing's forkserver object; what to do if a Python release renames it."""
    server = getattr(multiprocessing.forkserver, "_forkserver", None)
    if server is None or not all(hasattr(server, a) for a in ("_forkserver_pid", "_preload_modules", "_stop")):
        return None  # private API gone (tests/test_forkserver.py fails first): run with whatever preload it has
    return server


def preload_modules():
    """What the forkserver imports before it forks a rank (see Runtime).

    DP_COURSE_PRELOAD="mod,mod": modules every rank would otherwise import itself (the test suite names the labs'
    checks: tests/warm_kernels.py RANK_IMPORTS)."""
    dynamo = ["torch._dynamo"] if os.environ.get("DP_COURSE_PRELOAD_DYNAMO", "1") != "0" else []
    extra = [name for name in os.environ.get("DP_COURSE_PRELOAD", "").split(",") if name]
    # Last: from its 16th fork on, the forkserver's memory is in huge pages, so each fork of a rank copies ~95
    # page-table entries instead of ~48,000 (helpers/launcher/hugepages.py has the measurements).
    return ["helpers.launcher.worker", *dynamo, *extra, "helpers.launcher.hugepages"]


# The forkserver listens on an AF_UNIX socket in multiprocessing's temp dir, and such paths hold at most
# 107 bytes (103 on macOS): a long TMPDIR (macOS's /var/folders/..., a grading sandbox, pytest's tmp_path)
# fails with "AF_UNIX path too long". Above this length we move that temp dir to /tmp.
_MAX_SOCKET_DIR = 70


def short_socket_dir():
    """Keep multiprocessing's temp dir short enough for the forkserver's socket path."""
    if len(multiprocessing.util.get_temp_dir()) <= _MAX_SOCKET_DIR or not os.access("/tmp", os.W_OK):
        return
    short = tempfile.mkdtemp(prefix="pymp-", dir="/tmp")
    multiprocessing.util.Finalize(None, shutil.rmtree, args=(short, True), exitpriority=-100)
    # multiprocessing keeps no public setter: get_temp_dir() reads this, and ensure_running() calls it.
    multiprocessing.process.current_process()._config["tempdir"] = short


def start(preload):
    """Start the forkserver with `preload` unless it runs with it already (warm_up, start_in_kernel)."""
    short_socket_dir()
    if threading.current_thread() is not threading.main_thread():
        ensure_running(preload)
        return
    # The forkserver ignores SIGINT only once its preload finished; an interrupt during those seconds
    # (Jupyter signals the kernel's whole process group) would kill it. SIG_IGN survives exec.
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        ensure_running(preload)
    finally:
        signal.signal(signal.SIGINT, previous)


def start_in_kernel():
    """In a Jupyter kernel, start the forkserver now, in the background, before this process imports torch.

    `import helpers` calls it first thing: the forkserver's own imports (torch, torch._dynamo: 3-4 s of CPU) then
    run on the other core while the kernel imports torch, and while the student reads, instead of after it.
    Scripts, tests and the grader's host process start it at their first launch (a TODO's checks launch none).
    """
    if in_kernel() and "forkserver" in multiprocessing.get_all_start_methods():
        start(preload_modules())


def in_kernel():
    """True inside a Jupyter kernel (IPython with a kernel attached); never imports IPython itself."""
    ipython = sys.modules.get("IPython")
    if "ipykernel" not in sys.modules or not hasattr(ipython, "get_ipython"):
        return False
    return getattr(ipython.get_ipython(), "kernel", None) is not None


def ensure_running(preload):
    """Start the forkserver with `preload` imported; one that lacks some of it restarts with both lists.

    The union, not the new list: a process that alternates (make test's workers: a grading test, then a launch,
    then grading again) would otherwise restart it every time, ~7 s of imports each; with the union it restarts
    once. Modules a child does not need are only memory it shares with the forkserver.
    """
    preload = list(preload)
    server = _server()
    if server is not None and server._forkserver_pid is not None:
        running = list(server._preload_modules)
        missing = [m for m in preload if m not in running]
        if missing:
            # Stopping it leaves the processes it forked running: they are the caller's children's business.
            server._stop()
        preload = running + missing
    multiprocessing.forkserver.set_forkserver_preload(preload)
    start_resource_tracker()
    multiprocessing.forkserver.ensure_running()
    stop_before_kernel_shutdown()


# multiprocessing.forkserver.main's parameters in Python 3.9-3.13; 3.14 adds an authentication key, which this
# module does not set up, so there start_by_fork() declines and the forkserver starts the usual way.
_MAIN_PARAMETERS = ["listener_fd", "alive_r", "preload", "main_path", "sys_path"]


def start_by_fork(preload):
    """Start the forkserver as a fork of this process; False (and nothing done) where that is not possible.

    Only for a process that has started no thread of its own (a kernel launcher before the kernel starts): a fork
    copies the calling thread only, and any lock another thread held stays locked in the child. What the usual
    start does, minus the new interpreter: the same listener, "alive" pipe and main loop; importing `preload`
    here means the child has it already (measured: 3-4 s of CPU less per kernel, see tests/warm_kernels.py).
    """
    preload = list(preload)
    server = _server()
    main = multiprocessing.forkserver.main
    if (server is None or server._forkserver_pid is not None
            or list(inspect.signature(main).parameters) != _MAIN_PARAMETERS):
        return False
    for name in preload:
        importlib.import_module(name)
    start_resource_tracker()  # its fd goes to every rank, as in the usual start
    address = multiprocessing.connection.arbitrary_address("AF_UNIX")
    with socket.socket(socket.AF_UNIX) as listener:
        listener.bind(address)
        os.chmod(address, 0o600)
        listener.listen()
        alive_r, alive_w = os.pipe()
        pid = os.fork()
        if pid == 0:  # the forkserver: it must not hold the write end, or it never sees its clients go
            _serve(main, listener.fileno(), alive_r, alive_w, preload)
    os.setpgid(pid, pid)  # the child does it too: whichever runs first, it is out of our group when we go on
    os.close(alive_r)
    server._forkserver_address, server._forkserver_alive_fd = address, alive_w
    server._forkserver_pid, server._preload_modules = pid, preload
    return True


def _serve(main, listener_fd, alive_r, alive_w, preload):
    """The forked child: multiprocessing's forkserver loop, then exit without running the parent's clean-ups."""
    try:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # main() does this too, but a ^C may come before it
        os.setpgid(0, 0)  # out of the kernel's process group: stop_before_kernel_shutdown says why
        os.close(alive_w)
        hugepages.count_forks_here()  # the ranks' forks are this process's, not the kernel's
        main(listener_fd, alive_r, preload)
    finally:
        os._exit(0)


def stop_before_kernel_shutdown():
    """In an IPython kernel, stop the forkserver (and reap it) when a shutdown or restart begins.

    ipykernel's shutdown signals every child in the kernel's process group and waits, up to 14 s, until none is
    left; the forkserver dies at the first SIGTERM but stays a zombie, a child still, since nothing waits for it.
    Jupyter then gives up after its shutdown_wait_time (5 s) and kills the kernel: every restart took 5 s. A
    forkserver started by start_by_fork leaves the group instead (its _serve), before the kernel exists, and
    exits without the interpreter's teardown.
    """
    server = _server()
    kernel = getattr(getattr(sys.modules.get("IPython"), "get_ipython", lambda: None)(), "kernel", None)
    if server is None or kernel is None or getattr(kernel.do_shutdown, "stops_forkserver", False):
        return
    do_shutdown = kernel.do_shutdown

    def stop_then_shut_down(*args, **kwargs):
        if server._forkserver_pid is not None:
            # A kill, not its "alive" pipe closed: exiting, an interpreter with torch spends seconds tearing it
            # down for nothing. Its children, ranks that finished, need nothing from it. _stop() reaps it.
            os.kill(server._forkserver_pid, signal.SIGKILL)
            server._stop()
        return do_shutdown(*args, **kwargs)

    stop_then_shut_down.stops_forkserver = True
    kernel.do_shutdown = stop_then_shut_down


def start_resource_tracker():
    """multiprocessing's resource tracker, started as multiprocessing starts it but in a session of its own.

    ipykernel's shutdown sends SIGTERM to each child in the kernel's process group, waiting 0.01 s, 0.03 s, ... up
    to 14 s in all for them to go before a SIGKILL. The tracker ignores SIGTERM, so a kernel that had started the
    forkserver took Jupyter's whole shutdown_wait_time (5 s), then a kill, to shut down or restart. Outside the
    group ipykernel leaves it alone, and it still ends as always: when the last holder of its pipe exits.
    """
    tracker = multiprocessing.resource_tracker._resource_tracker
    if getattr(tracker, "_fd", 0) is not None or not hasattr(tracker, "_pid"):
        multiprocessing.resource_tracker.ensure_running()  # running already, or a Python without these names
        return
    read_end, write_end = os.pipe()
    command = [multiprocessing.spawn.get_executable(), *multiprocessing.util._args_from_interpreter_flags(),
               "-c", f"from multiprocessing.resource_tracker import main;main({read_end})"]
    # As multiprocessing does: SIGINT and SIGTERM blocked until the tracker has installed its own handlers.
    blocked = {signal.SIGINT, signal.SIGTERM}
    signal.pthread_sigmask(signal.SIG_BLOCK, blocked)
    try:
        tracker_process = subprocess.Popen(command, pass_fds=(read_end, *_stderr_fd()), start_new_session=True)
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, blocked)
        os.close(read_end)
    tracker._fd, tracker._pid = write_end, tracker_process.pid


def _stderr_fd():
    """stderr's fd for the tracker's warnings, as multiprocessing passes it; none where stderr has no fd (a kernel)."""
    try:
        return [sys.stderr.fileno()]
    except Exception:  # noqa: BLE001 - io.UnsupportedOperation, ValueError, AttributeError: all mean no fd
        return []


def preloaded():
    """The modules the running forkserver imported; None when none runs."""
    server = _server()
    if server is None or server._forkserver_pid is None:
        return None
    return list(server._preload_modules)
