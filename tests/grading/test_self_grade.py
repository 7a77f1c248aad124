"""A real lab through the whole grader: its solution scores full marks, its student version 0.

Every lab's probes run in tests/test_labs.py (on the solution: a stable value each; on the student version: not
implemented), inside the papermill runs it makes anyway. Grading costs three sandboxed kernels per lab, so the
full path runs here for one lab; the fixture lab in test_grade_fixture.py covers adversarial submissions.
"""
import csv
import shutil

import pytest

from helpers.grading import grade as grading
from helpers.grading.labgen import ROOT

LABS = ["03"]  # manual DDP: multi-rank probes, a training loop; the lab `make bench-grading` times


@pytest.mark.timeout(600)
@pytest.mark.parametrize("lab", LABS)
def test_solution_full_marks_student_version_zero(lab, tmp_path):
    submissions = tmp_path / "submissions"
    submissions.mkdir()
    shutil.copy(grading.lab_notebook(ROOT / "solutions", lab), submissions / "solution.ipynb")
    shutil.copy(grading.lab_notebook(ROOT / "labs", lab), submissions / "student.ipynb")
    grading.grade(lab, submissions, tmp_path / "out", jobs=2)
    with open(tmp_path / "out" / "grades.csv") as f:
        rows = {row["student"]: row for row in csv.DictReader(f)}
    assert rows["solution"]["total"] == rows["solution"]["max"], rows["solution"]
    assert rows["solution"]["status"] == "ok"
    assert rows["student"]["total"] == "0", rows["student"]
