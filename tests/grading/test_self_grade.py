"""A real lab through the whole grader: its solution scores full marks, its student version 0, and one mistake costs
only the question it is in (the questions after it are graded with the solution's earlier answers: reference.py).

Every lab's probes run in tests/test_labs.py (on the solution: a stable value each; on the student version: not
implemented), inside the papermill runs it makes anyway. Grading costs three sandboxed kernels per lab, so the
full path runs here for one lab; the fixture lab in test_grade_fixture.py covers adversarial submissions.
"""
import csv
import shutil

import nbformat
import pytest

from helpers.grading import grade as grading
from helpers.grading.prepare.labgen import ROOT
from tests.mistakes import lab03 as mistakes_03
from tests.mistakes import lab05 as mistakes_05
from tests.mistakes import lab10 as mistakes_10

# 03: multi-rank probes, a training loop, the lab `make bench-grading` times. 10: a part graded by hand (the
# report: pending until the instructor enters its points), judges in the grader's process, and the forgery that
# once scored 5/5 on the old 10.3 (probe_runtime._evaluate patched to return what the probe should have seen). 05: the
# probes that record a question's public checks in the kernel for the grader to replay
# (helpers/grading/judge/replay.py),
# graded with a solution and one mistake only (its TODO version: tests/test_labs.py).
LABS = ["03", "10", "05"]
FORGED_10_3 = ("import torch, helpers.grading.run.probe_runtime as pr\n"
               "def bring_flat_shard():\n    return object\n"
               "pr._evaluate = lambda expr, ns: {'value': {'steps': 20, 'identical': True, 'different_data': True,"
               " 'loss_fell': True, 'matches_ddp': True}}\n")


def _released_with(lab, path, answers):
    """The released lab with {question: answer cell source} put in (the lab's metadata says which cells); the
    solution's answer where the source is None; report: the text of lab 10's report cell."""
    nb = nbformat.read(grading.lab_notebook(ROOT / "labs", lab), as_version=4)
    solution = nbformat.read(grading.lab_notebook(ROOT / "solutions", lab), as_version=4)
    for cell, theirs in zip(nb.cells, solution.cells):
        for question in cell.get("metadata", {}).get("dp_course", {}).get("answers", []):
            if question in answers:
                cell.source = theirs.source if answers[question] is None else answers[question]
        if cell.get("id") == "report-analysis" and "report" in answers:
            cell.source = answers["report"]
    nbformat.write(nb, path)


def _forger(lab, path):
    """The released lab with the forgery as 10.3; 10.1 and 10.2 stay TODOs (broken_reducer scores the honest 10.2
    and 10.3: a third answer here only cost its probe and its training run)."""
    _released_with(lab, path, {"10.3": FORGED_10_3})


# Lab 03 with the catalogued mistake of issue 28: 3.3 forgets `/ world_size`. It costs 3.3 only: 3.4, whose training
# loop calls average_gradients, is graded with the solution's, and its feedback says what the student's own did.
SUM_3_3 = next(m for m in mistakes_03.MISTAKES if m.name == "sum without the division")
# Lab 10 with a broken lab-04 Reducer in 10.1 (the bucket's sum never divided): 10.2 and 10.3, the solution's, score
# in full and the report is collected for the instructor.
BROKEN_REDUCER = next(m for m in mistakes_10.MISTAKES if m.name == "the bucket's sum never divided by the world size")
# Lab 05 with 5.1's losses not scaled: 5.3, whose public check trains with accumulate_and_step, is graded with the
# solution's; 5.1's feedback names the mistake as its public check does.
UNSCALED = next(m for m in mistakes_05.MISTAKES if m.name == "losses not scaled")  # its fragments; its cell:
UNSCALED_CELL = next(c.source for c in nbformat.read(grading.lab_notebook(ROOT / "solutions", "05"), as_version=4).cells
                     if c.get("id") == "q1").replace("loss_fn(model(x), y) * (len(y) / total)", "loss_fn(model(x), y)")
WRONG = {"03": "3.3", "10": "10.1", "05": "5.1"}
REPORT = "My Reducer sends 2 (N-1)/N x 4 psi bytes per step, as ZeRO-2 does; FlatShard sends 1.5 times that."


def _one_mistake(lab, path):
    if lab == "03":
        _released_with(lab, path, {"3.1": None, "3.2": None, "3.3": SUM_3_3.override, "3.4": None})
    elif lab == "05":
        _released_with(lab, path, {"5.1": UNSCALED_CELL, "5.2": None, "5.3": None})
    else:
        _released_with(lab, path, {"10.1": BROKEN_REDUCER.override, "10.2": None, "10.3": None, "10.5": None,
                                   "report": REPORT})


@pytest.mark.timeout(600)
@pytest.mark.parametrize("lab", LABS)
def test_solution_full_marks_student_version_zero(lab, tmp_path):
    submissions = tmp_path / "submissions"
    submissions.mkdir()
    shutil.copy(grading.lab_notebook(ROOT / "solutions", lab), submissions / "solution.ipynb")
    if lab != "05":
        shutil.copy(grading.lab_notebook(ROOT / "labs", lab), submissions / "student.ipynb")
    if lab == "10":
        _forger(lab, submissions / "forger.ipynb")
    _one_mistake(lab, submissions / "one_mistake.ipynb")
    grading.grade(lab, submissions, tmp_path / "out", jobs=2)
    rows = _grades(tmp_path / "out")
    _assert_one_mistake_one_question(lab, tmp_path / "out", rows)
    by_hand = 6 if lab == "10" else 0   # lab 10's report, graded by hand
    assert float(rows["solution"]["total"]) == float(rows["solution"]["max"]) - by_hand, rows["solution"]
    assert rows["solution"]["status"] == "ok"
    assert lab == "05" or rows["student"]["total"] == "0", rows["student"]
    if lab == "10":
        assert rows["forger"]["10.3"] == "0", rows["forger"]
        assert rows["solution"]["10.4 (by hand)"] == "" and rows["solution"]["by_hand"] == "pending"
        _hand_grade(tmp_path, submissions)


def _assert_one_mistake_one_question(lab, out, rows):
    mine, theirs = rows["one_mistake"], rows["solution"]
    wrong = WRONG[lab]
    questions = [q for q in theirs if q[0].isdigit() and "by hand" not in q]
    assert float(mine[wrong]) < float(theirs[wrong]), mine
    assert {q: mine[q] for q in questions if q != wrong} == {q: theirs[q] for q in questions if q != wrong}, mine
    feedback = (out / "feedback" / "one_mistake.md").read_text()
    if lab == "03":
        assert "3.4 passes with the reference `average_gradients`; with yours it fails (see 3.3)" in feedback, feedback
    elif lab == "05":
        first = next(line for line in feedback.splitlines() if line.startswith("- ") and "failed:" in line)
        assert all(fragment in first for fragment in UNSCALED.first_line), feedback
        note = "5.3 passes with the reference `accumulate_and_step`; with yours it fails (see 5.1)"
        assert note in feedback, feedback
    else:
        assert (out / "manual" / "10.4" / "one_mistake.md").read_text().strip().endswith(REPORT), "report not collected"


def _grades(out):
    with open(out / "grades.csv") as f:
        return {row["student"]: row for row in csv.DictReader(f)}


def _hand_grade(tmp_path, submissions):
    """The instructor enters the report's points in OUT/manual.csv and runs the command again with RESUME=1."""
    out = tmp_path / "out"
    with open(out / "manual.csv") as f:
        sheet = list(csv.DictReader(f))
    assert {row["student"] for row in sheet} == {"solution", "student", "forger", "one_mistake"}
    for row in sheet:
        row["points"] = "6" if row["student"] == "solution" else "0"
    with open(out / "manual.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(sheet[0]))
        writer.writeheader()
        writer.writerows(sheet)
    grading.grade("10", submissions, out, jobs=2, resume=True)   # nothing runs again: every result is trusted
    rows = _grades(out)
    assert rows["solution"]["total"] == rows["solution"]["max"] and rows["solution"]["by_hand"] == "graded", rows
