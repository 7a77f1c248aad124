"""A real lab through the whole grader: its solution scores full marks, its student version 0.

Every lab's probes run in tests/test_labs.py (on the solution: a stable value each; on the student version: not
implemented), inside the papermill runs it makes anyway. Grading costs three sandboxed kernels per lab, so the
full path runs here for one lab; the fixture lab in test_grade_fixture.py covers adversarial submissions.
"""
import csv
import shutil

import nbformat
import pytest

from helpers.grading import grade as grading
from helpers.grading.labgen import ROOT

# 03: multi-rank probes, a training loop, the lab `make bench-grading` times. 10: a part graded by hand (the
# report: pending until the instructor enters its points), judges in the grader's process, and the forgery that
# once scored 5/5 on the old 10.3 (probe_runtime._evaluate patched to return what the probe should have seen).
LABS = ["03", "10"]
FORGED_10_3 = ("import torch, helpers.grading.probe_runtime as pr\n"
               "def bring_flat_shard():\n    return object\n"
               "pr._evaluate = lambda expr, ns: {'value': {'steps': 20, 'identical': True, 'different_data': True,"
               " 'loss_fell': True, 'matches_ddp': True}}\n")


def _forger(lab, path):
    """The released lab with the solution's 10.1 and the forgery as 10.3 (the lab's metadata says which cells).

    10.2 stays a TODO: the assertions need one honest answer scored as the solution's (10.1, before the forgery
    patches anything) and the forged one scored 0; a third answer only cost its probe and its training run (the
    whole solution as forger: one more full run of the lab, the test's most expensive grading)."""
    nb = nbformat.read(grading.lab_notebook(ROOT / "labs", lab), as_version=4)
    solution = nbformat.read(grading.lab_notebook(ROOT / "solutions", lab), as_version=4)
    for cell, theirs in zip(nb.cells, solution.cells):
        answers = cell.get("metadata", {}).get("dp_course", {}).get("answers", [])
        if "10.1" in answers:
            cell.source = theirs.source
        elif "10.3" in answers:
            cell.source = FORGED_10_3
    nbformat.write(nb, path)


@pytest.mark.timeout(600)
@pytest.mark.parametrize("lab", LABS)
def test_solution_full_marks_student_version_zero(lab, tmp_path):
    submissions = tmp_path / "submissions"
    submissions.mkdir()
    shutil.copy(grading.lab_notebook(ROOT / "solutions", lab), submissions / "solution.ipynb")
    shutil.copy(grading.lab_notebook(ROOT / "labs", lab), submissions / "student.ipynb")
    if lab == "10":
        _forger(lab, submissions / "forger.ipynb")
    grading.grade(lab, submissions, tmp_path / "out", jobs=2)
    rows = _grades(tmp_path / "out")
    by_hand = 6 if lab == "10" else 0   # lab 10's report, graded by hand
    assert float(rows["solution"]["total"]) == float(rows["solution"]["max"]) - by_hand, rows["solution"]
    assert rows["solution"]["status"] == "ok"
    assert rows["student"]["total"] == "0", rows["student"]
    if lab == "10":
        assert rows["forger"]["10.3"] == "0" and rows["forger"]["10.1"] == rows["solution"]["10.1"], rows["forger"]
        assert float(rows["forger"]["10.1"]) > 0, rows["forger"]
        assert rows["solution"]["10.4 (by hand)"] == "" and rows["solution"]["by_hand"] == "pending"
        _hand_grade(tmp_path, submissions)


def _grades(out):
    with open(out / "grades.csv") as f:
        return {row["student"]: row for row in csv.DictReader(f)}


def _hand_grade(tmp_path, submissions):
    """The instructor enters the report's points in OUT/manual.csv and runs the command again with RESUME=1."""
    out = tmp_path / "out"
    with open(out / "manual.csv") as f:
        sheet = list(csv.DictReader(f))
    assert {row["student"] for row in sheet} == {"solution", "student", "forger"}
    for row in sheet:
        row["points"] = "6" if row["student"] == "solution" else "0"
    with open(out / "manual.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(sheet[0]))
        writer.writeheader()
        writer.writerows(sheet)
    grading.grade("10", submissions, out, jobs=2, resume=True)   # nothing runs again: every result is trusted
    rows = _grades(out)
    assert rows["solution"]["total"] == rows["solution"]["max"] and rows["solution"]["by_hand"] == "graded", rows
