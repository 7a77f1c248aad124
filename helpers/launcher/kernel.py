"""`python -m helpers.launcher.kernel -f CONNECTION_FILE`: an IPython kernel that starts with the launcher's forkserver.

The usual kernel (`python -m ipykernel_launcher`) starts the forkserver at its first launch: a second interpreter
that imports torch again (3-4 s of CPU on a 2-core machine). This one imports the forkserver's modules itself,
forks the forkserver before ipykernel starts any thread (helpers.launcher.forkserver.start_by_fork says why that order
matters), then becomes ipykernel_launcher, with the same sys.argv and main module. The class grader starts its
sandboxed kernels this way, and the tests' kernels (tests/kernel_zygote.py) run main() after their fork.
Where the fork is not possible (another Python's multiprocessing), launch() starts a forkserver as usual.
"""
import runpy
import sys
from pathlib import Path

from helpers.launch import start_forkserver_by_fork


def main(argv):
    """Start the forkserver, then run ipykernel_launcher with argv (its command-line arguments)."""
    if sys.path and (sys.path[0] == "" or Path(sys.path[0]) == Path.cwd()):
        del sys.path[0]  # as ipykernel_launcher does; IPython puts it back first, as "" (a python -m side effect)
    start_forkserver_by_fork()
    sys.argv = ["ipykernel_launcher", *argv]
    runpy.run_module("ipykernel_launcher", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main(sys.argv[1:])
