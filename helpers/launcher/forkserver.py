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
import multiprocessing.resource_tracker
import os
import signal
import socket


def _server():
    """multiprocessing's forkserver object; what to do if a Python release renames it."""
    server = getattr(multiprocessing.forkserver, "_forkserver", None)
    if server is None or not all(hasattr(server, a) for a in ("_forkserver_pid", "_preload_modules", "_stop")):
        return None  # private API gone (tests/test_forkserver.py fails first): run with whatever preload it has
    return server


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
    multiprocessing.forkserver.ensure_running()


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
    multiprocessing.resource_tracker.ensure_running()  # its fd goes to every rank, as in the usual start
    address = multiprocessing.connection.arbitrary_address("AF_UNIX")
    with socket.socket(socket.AF_UNIX) as listener:
        listener.bind(address)
        os.chmod(address, 0o600)
        listener.listen()
        alive_r, alive_w = os.pipe()
        pid = os.fork()
        if pid == 0:  # the forkserver: it must not hold the write end, or it never sees its clients go
            _serve(main, listener.fileno(), alive_r, alive_w, preload)
    os.close(alive_r)
    server._forkserver_address, server._forkserver_alive_fd = address, alive_w
    server._forkserver_pid, server._preload_modules = pid, preload
    return True


def _serve(main, listener_fd, alive_r, alive_w, preload):
    """The forked child: multiprocessing's forkserver loop, then exit without running the parent's clean-ups."""
    try:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # main() does this too, but a ^C may come before it
        os.close(alive_w)
        main(listener_fd, alive_r, preload)
    finally:
        os._exit(0)


def preloaded():
    """The modules the running forkserver imported; None when none runs."""
    server = _server()
    if server is None or server._forkserver_pid is None:
        return None
    return list(server._preload_modules)
