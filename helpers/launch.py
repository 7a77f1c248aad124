"""`launch(fn, world_size)`: run a function on several ranks from a notebook cell.

How (the reasons are in the package docstring, helpers/__init__.py): a forkserver started once
per kernel with torch preloaded forks fresh worker processes for every call; the function travels
by value (cloudpickle), so functions defined in notebook cells work; ranks meet in a TCPStore
hosted by the kernel on an OS-chosen port, under a key prefix of their own per call. The run loop
itself lives in helpers.launcher.run.
From a plain script, guard the call with `if __name__ == "__main__":`: multiprocessing imports the
script's main module again in every worker.
"""
import itertools
import multiprocessing
import multiprocessing.process
import multiprocessing.util
import os
import sys

import cloudpickle
import torch.distributed as dist

from helpers.backend import gpu_count, select_backend
from helpers.errors import LaunchError
from helpers.launcher import device_guard, forkserver
from helpers.launcher.main_guard import require_main_guard
from helpers.launcher.run import Run

# Above this, a CPU machine would thrash; raise it deliberately on a big GPU box.
MAX_WORLD_SIZE = 64
# Seconds the process-group timeout exceeds hang_timeout: the watchdog reports first, with call sites.
TIMEOUT_MARGIN_S = 15.0


class Runtime:
    """Per-kernel state: the forkserver context and the rendezvous store."""

    def __init__(self):
        self.context = multiprocessing.get_context("forkserver")
        # Workers start with torch and the worker module already imported (about 0.1 s per call).
        # torch._dynamo too: DDP's constructor and the first optimizer step import it, which costs
        # 3-4 s in every fresh rank (measured: a 3-rank DDP step 4.3 s -> 0.2 s with the preload).
        # DP_COURSE_PRELOAD_DYNAMO=0 skips it where no rank needs it: the grader, for a lab without DDP or
        # an optimizer, saves 1.3 s of CPU per student (lab 03: 7.7 -> 6.1 s).
        self.preload = forkserver.preload_modules()
        self.store = dist.TCPStore("127.0.0.1", 0, None, True, wait_for_workers=False)
        self.calls = itertools.count()

    def spec(self, backend, hang_timeout, call, check_collectives=False):
        """What every rank of one call needs to know, as plain data."""
        return {"host": "127.0.0.1", "port": self.store.port, "backend": backend,
                "prefix": f"launch/{os.getpid()}/{next(self.calls)}/", "hang_timeout": hang_timeout,
                "check_collectives": check_collectives,  # helpers.launcher.collective_check
                "timeout_margin": TIMEOUT_MARGIN_S, "threads": 1, "call": call,
                # read here, in the kernel: the forkserver's environment is as old as the forkserver
                "device_guard": device_guard.mode_from_env(),
                # a directory: every rank appends its device and its collectives there (make gpu-check)
                "collective_log": os.environ.get("DP_COURSE_COLLECTIVE_LOG", "")}


preload_modules = forkserver.preload_modules  # the tests' kernels name it here


def start_forkserver_by_fork():
    """For a kernel launcher, before the kernel starts any thread: the forkserver as a fork of it (see
    helpers.launcher.forkserver.start_by_fork); False where it cannot, and launch() then starts one the usual way."""
    if "forkserver" not in multiprocessing.get_all_start_methods():
        return False
    forkserver.short_socket_dir()
    return forkserver.start_by_fork(preload_modules())


_runtime = None


def runtime():
    """The kernel's Runtime, created on first use (no side effects at import)."""
    global _runtime
    if _runtime is None:
        _runtime = Runtime()
    return _runtime


def warm_up():
    """Start the forkserver (if it is not running), so that launches do not pay for importing torch."""
    require_forkserver()
    forkserver.start(runtime().preload)


def require_forkserver():
    """Fail in one line where the forkserver start method does not exist (Windows has only spawn)."""
    if "forkserver" in multiprocessing.get_all_start_methods():
        return
    where = "Windows" if sys.platform == "win32" else sys.platform
    raise LaunchError(f"helpers.launch needs multiprocessing's 'forkserver' start method, which {where} does not "
                      f"have (only {multiprocessing.get_all_start_methods()}): run the course in WSL2 (Ubuntu on "
                      "Windows, https://learn.microsoft.com/windows/wsl/install) or on Linux or macOS")


def check_arguments(fn, world_size, hang_timeout, check_collectives=False):
    """Reject bad input before any process starts, saying what to pass instead."""
    if not callable(fn):
        raise TypeError(f"launch(fn, ...) needs a function to run on every rank, got {type(fn).__name__}; "
                        "define one with def and pass it without calling it: launch(train, 4)")
    if isinstance(world_size, bool) or not isinstance(world_size, int):
        raise TypeError(f"world_size must be an int (the number of ranks), got {world_size!r}")
    if world_size < 1:
        raise ValueError(f"world_size={world_size}: a run needs at least 1 rank; try 2 or 4")
    if world_size > MAX_WORLD_SIZE:
        raise ValueError(f"world_size={world_size} would start {world_size} processes on {os.cpu_count()} "
                         f"CPU cores; use at most {MAX_WORLD_SIZE} (helpers.launch.MAX_WORLD_SIZE)")
    if not hang_timeout > 0:
        raise ValueError(f"hang_timeout={hang_timeout!r} must be a positive number of seconds, e.g. 30")
    if not isinstance(check_collectives, bool):
        raise TypeError(f"check_collectives={check_collectives!r} must be True or False")


def pickle_call(fn, args, kwargs):
    """Serialise fn and its arguments by value; name the piece that cannot travel."""
    try:
        return cloudpickle.dumps((fn, tuple(args), dict(kwargs)))
    except Exception as exc:  # noqa: BLE001 - pickling fails with many exception types
        failure = exc
    # Only now, piece by piece: pickling a notebook's function walks sys.modules for the packages it uses, and doing
    # it twice for every launch cost make test ~10 CPU-s (py-spy).
    pieces = [("fn", fn)] + [(f"args[{i}]", a) for i, a in enumerate(args)]
    pieces += [(f"kwargs[{k!r}]", v) for k, v in kwargs.items()]
    for name, value in pieces:
        try:
            cloudpickle.dumps(value)
        except Exception as exc:  # noqa: BLE001
            failure, culprit = exc, f"{name} (a {type(value).__name__})"
            break
    else:
        culprit = "fn with its arguments"
    raise TypeError(f"{culprit} cannot be sent to the workers: {failure}. "
                    "Pass plain data or tensors, or create the object inside fn on each rank.") from None


def launch(fn, world_size, *, args=(), kwargs=None, backend="auto", hang_timeout=30.0, check_collectives=False):
    """Run fn(*args, **kwargs) on world_size ranks; return the results indexed by rank.

    check_collectives=True: before each collective the ranks compare their calls, and a difference raises
    CollectiveMismatch instead of a hang, a crash or a wrong result. It adds 0.5 to 6 ms per collective on a
    shared 2-core machine (helpers.launcher.collective_check says how it was measured); off, it costs nothing."""
    require_main_guard()
    require_forkserver()
    check_arguments(fn, world_size, hang_timeout, check_collectives)
    backend = select_backend(backend, world_size, gpu_count())
    call = pickle_call(fn, args, kwargs or {})
    warm_up()
    rt = runtime()
    spec = rt.spec(backend, float(hang_timeout), call, check_collectives)
    with Run(rt.context, world_size, spec) as run:
        return run.wait()
