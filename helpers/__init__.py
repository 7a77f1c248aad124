"""Shared infrastructure of the course: launching ranks, ledgers, formulas, plots, widgets, grading.

Map of the package (the modules a notebook imports are at the top level):
  launching    launch (launch(fn, world_size); %%ranks N after `%load_ext helpers`), errors (what launch raises),
               backend (NCCL or Gloo, rank_device()); launcher/ holds how it works (its docstring maps it)
  instruments  comm (ledger of collectives), memory (model-state bytes, peak memory)
  formulas     theory, theory_comm (ZeRO memory, communication, alpha-beta costs),
               simulate (a DDP step past one machine)
  figures      plot, plot_collectives, widgets (the chapter 06 calculator)
  grading      grading/ (public checks, lab generation from solutions, the instructor's grader)

How `launch` runs ranks, and why:
- A forkserver, started once per kernel with torch (and the rank side, launcher/worker.py) preloaded, forks
  fresh worker processes for every call. Plain `fork` from the kernel deadlocks once the kernel has run a
  multi-threaded op; `spawn` re-imports the main module, so it cannot see functions defined in notebook cells.
- The function travels by value (cloudpickle), so a function defined in a cell works.
- Ranks meet in a TCPStore hosted by the kernel on a port the OS chooses, each call under a key prefix of
  its own, so calls never clash over ports or keys.
- The process-group timeout is hang_timeout plus a margin (launch.TIMEOUT_MARGIN_S), never Gloo's
  30-minute default, so the launcher's watchdog, which knows each rank's call site, reports a hang first.
- Workers ignore SIGINT; on an interrupt or a failure the launcher stops them (SIGTERM, then SIGKILL), and
  a worker exits when its pipe to the kernel closes.
- NCCL when each rank can have a GPU of its own, Gloo otherwise (helpers.backend).
"""
# First, before anything here imports torch: in a Jupyter kernel, the ranks' forkserver starts now and imports
# torch on the other core while this process does (a lab's first check 3.3 -> 1.x s, tests/bench_first_check.py).
from helpers.launcher import forkserver as _forkserver

_forkserver.start_in_kernel()

from helpers.errors import CollectiveHang, CollectiveMismatch, LaunchError, RankFailed  # noqa: E402

# Eager on purpose: a lazy `launch` would be shadowed by the submodule helpers.launch once imported.
from helpers.launch import launch  # noqa: E402

__all__ = ["launch", "LaunchError", "RankFailed", "CollectiveHang", "CollectiveMismatch", "load_ipython_extension"]


def load_ipython_extension(ipython):
    """`%load_ext helpers`: register the %%ranks cell magic and start the forkserver."""
    from helpers.launcher.magic import register

    register(ipython)
