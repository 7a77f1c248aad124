"""multiprocessing's forkserver, started with the modules its caller needs.

A process has one forkserver, and its preload is fixed when it starts. The launcher wants torch, torch._dynamo
and helpers.worker in it; the class grader wants its grading modules. A process that uses both (the test suite,
a notebook that grades) otherwise keeps whichever started first: ranks forked from the grader's forkserver then
import torch._dynamo in every rank (measured: lab 05's check tests 27 s alone, 187 s after a grading test in the
same pytest process). So a different preload restarts the forkserver.
"""
import multiprocessing.forkserver


def _server():
    """multiprocessing's forkserver object; what to do if a Python release renames it."""
    server = getattr(multiprocessing.forkserver, "_forkserver", None)
    if server is None or not all(hasattr(server, a) for a in ("_forkserver_pid", "_preload_modules", "_stop")):
        return None  # private API gone (tests/test_forkserver.py fails first): run with whatever preload it has
    return server


def ensure_running(preload):
    """Start the forkserver with exactly `preload` imported, restarting it if it runs with other modules."""
    preload = list(preload)
    server = _server()
    if server is not None and server._forkserver_pid is not None and server._preload_modules != preload:
        # Stopping it leaves the processes it forked running: they are the caller's children's business.
        server._stop()
    multiprocessing.forkserver.set_forkserver_preload(preload)
    multiprocessing.forkserver.ensure_running()


def preloaded():
    """The modules the running forkserver imported; None when none runs."""
    server = _server()
    if server is None or server._forkserver_pid is None:
        return None
    return list(server._preload_modules)
