"""pytest plugin (make test loads it with -p): xdist's loadscope hands out the longest test files first.

make test runs on 2 workers with --dist loadscope: a file's tests (a notebook's cells) stay on one worker. xdist
orders the files by their number of tests, so a file of 3 long tests (the browser's, 80 s) started last and the
other worker sat idle while it ran. Handing out the longest first (the classic LPT rule) ends both workers at
about the same time. The lengths are the wall seconds of a measured run, kept in tests/scope_seconds.json; a file
not in it counts as its number of tests times the median seconds per test.

Refresh the table after adding or changing slow tests:
    make test PYTEST_ARGS="--write-scope-seconds"
"""
import json
import pathlib
import statistics
from collections import defaultdict

import pytest
from xdist.scheduler import LoadScopeScheduling

TABLE = pathlib.Path(__file__).with_name("scope_seconds.json")


def pytest_addoption(parser):
    parser.addoption("--write-scope-seconds", action="store_true",
                     help="write each test file's wall seconds in this run to the table (longest_first)")
    parser.addoption("--scope-seconds", type=pathlib.Path, default=TABLE,
                     help=f"the table of seconds per test file (default: tests/{TABLE.name})")


def scope_of(nodeid):
    """xdist loadscope's unit: everything left of the last '::' (a file, or a class in it)."""
    return nodeid.rsplit("::", 1)[0]


def read_table(path):
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return {}


def ordered_scopes(scopes, table):
    """`scopes`: {scope: number of tests}. Longest expected first; unknown scopes by their test count."""
    known = [table[s] / n for s, n in scopes.items() if s in table and n]
    per_test = statistics.median(known) if known else 1.0
    return sorted(scopes, key=lambda s: -table.get(s, per_test * scopes[s]))


class LongestFirst(LoadScopeScheduling):
    ordered = False

    def _assign_work_unit(self, node):
        # The first assignment happens once the queue of scopes is complete: reorder it then, once.
        if not self.ordered:
            table = read_table(self.config.getoption("--scope-seconds"))
            order = ordered_scopes({s: len(tests) for s, tests in self.workqueue.items()}, table)
            queue = {s: self.workqueue[s] for s in order}
            self.workqueue.clear()
            self.workqueue.update(queue)
            self.ordered = True
            self.log("longest first:", *order[:5])
        super()._assign_work_unit(node)


def pytest_xdist_make_scheduler(config, log):
    if config.getoption("dist") == "loadscope":
        return LongestFirst(config, log)
    return None


class _Recorder:
    def __init__(self, path):
        self.path, self.seconds = path, defaultdict(float)

    def pytest_runtest_logreport(self, report):
        self.seconds[scope_of(report.nodeid)] += report.duration

    def pytest_sessionfinish(self, session):
        table = read_table(self.path)
        table.update({s: round(t, 1) for s, t in self.seconds.items()})
        self.path.write_text(json.dumps(dict(sorted(table.items())), indent=1) + "\n")


@pytest.hookimpl(trylast=True)
def pytest_configure(config):
    # Only the controller (not an xdist worker) writes the table, from every worker's reports.
    if config.getoption("--write-scope-seconds") and not hasattr(config, "workerinput"):
        config.pluginmanager.register(_Recorder(config.getoption("--scope-seconds")), "longest_first_recorder")
