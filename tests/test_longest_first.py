"""tests/longest_first.py: xdist's loadscope hands out the longest test files first, by a table of seconds."""
import json
import os
import pathlib
import subprocess
import sys

import pytest

from tests.longest_first import ordered_scopes

ROOT = pathlib.Path(__file__).resolve().parents[1]
FILES = {"test_many.py": 5, "test_some.py": 3, "test_long.py": 1}   # file: number of tests


def test_order_follows_the_table_and_unknown_files_count_their_tests():
    table = {"a.py": 10.0, "b.py": 50.0, "c.py": 2.0}
    assert ordered_scopes({"a.py": 5, "b.py": 1, "c.py": 1}, table) == ["b.py", "a.py", "c.py"]
    # d.py is not in the table: 4 tests at the median 2 s per test (a: 2, b: 50, c: 2) = 8 s, between b and a.
    assert ordered_scopes({"a.py": 5, "b.py": 1, "c.py": 1, "d.py": 4}, table) == ["b.py", "a.py", "d.py", "c.py"]
    assert ordered_scopes({"x.py": 1, "y.py": 3}, {}) == ["y.py", "x.py"]


def run_suite(tmp_path, *plugin_args):
    """A suite of three files on one xdist worker; returns the files in the order their tests ran."""
    log = tmp_path / "order.txt"
    for name, count in FILES.items():
        (tmp_path / name).write_text("".join(
            f"def test_{i}():\n    open({str(log)!r}, 'a').write({name!r} + '\\n')\n" for i in range(count)))
    # Only xdist among the installed plugins: nbval's imports alone cost ~4 CPU-s per pytest process.
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
    subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "xdist.plugin", "-p", "no:cacheprovider", "-n", "1",
                    "--dist", "loadscope", *plugin_args, str(tmp_path)], check=True, capture_output=True, timeout=60,
                   cwd=tmp_path, env=env)
    return list(dict.fromkeys(log.read_text().split()))


@pytest.mark.timeout(120)
def test_the_longest_file_runs_first_and_the_run_can_write_the_table(tmp_path):
    # xdist alone: most tests first, so the one long test runs last.
    assert run_suite(tmp_path) == ["test_many.py", "test_some.py", "test_long.py"]
    (tmp_path / "order.txt").unlink()
    table = tmp_path / "seconds.json"
    table.write_text(json.dumps({"test_long.py": 60.0, "test_many.py": 1.0, "test_some.py": 2.0}))
    plugin = ["-p", "tests.longest_first", "--scope-seconds", str(table), "--write-scope-seconds"]
    assert run_suite(tmp_path, *plugin) == ["test_long.py", "test_some.py", "test_many.py"]
    # --write-scope-seconds replaced the table's figures by this run's (milliseconds each, rounded to 0.0).
    assert json.loads(table.read_text()) == {"test_long.py": 0.0, "test_many.py": 0.0, "test_some.py": 0.0}
