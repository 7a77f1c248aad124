"""The grading process's memory limit where no memory cgroup can be made: RLIMIT_AS, and a status that says so.

(With a memory cgroup: tests/grading/test_grade_fixture.py grades a student whose answer displays 300 MiB.)"""
import subprocess
import sys

import nbformat
import pytest

from helpers.grading.run import cgroup
from helpers.grading.run import grade_student as one
from helpers.grading.run.execute import Limits
from tests.grading import fixture_lab as lab

pytestmark = pytest.mark.timeout(60)


def test_without_a_cgroup_the_grading_process_meets_rlimit_as():
    # 512 MiB asked of a process allowed to grow by 256: a MemoryError, where no limit let it through.
    # cgroup.py alone, by its path: the helpers package imports torch (3 s a process).
    hog = ("import importlib.util\nspec = importlib.util.spec_from_file_location('cgroup', {path!r})\n"
           "cgroup = importlib.util.module_from_spec(spec)\nspec.loader.exec_module(cgroup)\n"
           "cgroup.limit_this_process({grow}, use_cgroup=False)\nhog = b'x' * (512 * 2**20)\nprint('held', len(hog))\n")
    path = cgroup.__file__
    free = subprocess.run([sys.executable, "-c", hog.format(path=path, grow=0)], capture_output=True, text=True)
    assert free.returncode == 0 and "held 536870912" in free.stdout, free.stderr[-2000:]
    held = subprocess.run([sys.executable, "-c", hog.format(path=path, grow=256 * 2**20)], capture_output=True,
                          text=True)
    assert held.returncode == 1 and held.stderr.rstrip().endswith("MemoryError"), held.stderr[-2000:]


def test_a_memory_error_in_the_grading_process_is_the_students_memory_limit(tmp_path, monkeypatch):
    lab.build(tmp_path)
    path = lab.submission(tmp_path, "hog")
    (tmp_path / "out" / "results").mkdir(parents=True)
    released = nbformat.read(tmp_path / "labs" / "97_fixture.ipynb", as_version=4)
    task = one.Task("97", released, str(tmp_path / "probes"), {}, 1, str(tmp_path / "out"),
                    Limits(grader_memory_bytes=2**30))

    def hog(*args, **kwargs):
        raise MemoryError

    monkeypatch.setattr(one, "limit_this_process", lambda *args: None)  # not this test's own process
    monkeypatch.setattr(one, "_graded", hog)
    result = one.grade_student(task, "hog", str(path))
    assert result["status"] == "memory_limit" and result["error"] == one.MEMORY_LIMIT.format(1024)
    assert {m["earned"] for marks in result["marks"].values() for m in marks} == {0.0}
