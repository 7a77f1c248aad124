"""pytest plugin (make test loads it with -p): the chapters run under nbval with the device guard pretending.

With DP_COURSE_DEVICE_GUARD=pretend in a chapter's kernel, rank_device() is a stand-in and a collective on a
tensor that would sit in host memory on a GPU machine fails its cell (helpers/launcher/device_guard.py). So every rank
function of every chapter is checked for the NCCL path on each make test, at no extra run time.
The variable is set only while a chapter's cells are set up (its kernel starts with the first one) and removed
after each, so the unit tests on the same pytest worker never see it.
"""
import os
import pathlib

import pytest


def _chapter(item):
    path = pathlib.Path(str(item.fspath))
    return path.stem if path.suffix == ".ipynb" and path.parent.name == "chapters" else None


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    if _chapter(item) is not None:
        os.environ[_env()] = "pretend"


def pytest_runtest_teardown(item):
    if _chapter(item) is not None:
        os.environ.pop(_env(), None)


def _env():
    # Imported when a chapter runs, not when the plugin loads: helpers imports torch (3 s of CPU), and make test's
    # xdist controller, which loads this plugin too, runs no test.
    from helpers.launcher.device_guard import ENV
    return ENV
