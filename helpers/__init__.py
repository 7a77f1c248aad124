"""Shared infrastructure of the course: launching ranks, ledgers, formulas, plots, widgets, grading."""
from helpers.errors import CollectiveHang, LaunchError, RankFailed

# Eager on purpose: a lazy `launch` would be shadowed by the submodule helpers.launch once imported.
from helpers.launch import launch

__all__ = ["launch", "LaunchError", "RankFailed", "CollectiveHang", "load_ipython_extension"]


def load_ipython_extension(ipython):
    """`%load_ext helpers`: register the %%ranks cell magic and start the forkserver."""
    from helpers.magic import register

    register(ipython)
