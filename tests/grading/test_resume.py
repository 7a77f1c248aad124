"""A class survives its grader: a killed or overdue student is a grader_error, --resume and --only go on."""
import csv
import json
import os

import pytest

from helpers.grading import grade as grading
from helpers.grading import state as run_state
from helpers.grading.grade_student import Task
from helpers.grading.report import load_results
from tests.grading import fixture_lab as lab

pytestmark = pytest.mark.timeout(300)

CLASS = {"correct": (lab.ADD, lab.RANK_SUM), "partly": (lab.ADD, "def rank_sum(world_size):\n    return 0.0\n")}


def _grades(out):
    with open(out / "grades.csv") as f:
        return {row["student"]: row for row in csv.DictReader(f)}


@pytest.fixture(scope="module")
def graded_once(tmp_path_factory):
    root = tmp_path_factory.mktemp("resume")
    lab.build(root)
    for student, (add, rank_sum) in CLASS.items():
        lab.submission(root, student, add, rank_sum)
    out = root / "out"
    assert grading.main(["--lab", "97", "--submissions", str(root / "submissions"), "--out", str(out),
                         "--probes", str(root / "probes"), "--solutions", str(root / "solutions"),
                         "--labs", str(root / "labs")]) == 0
    return root, out


def _grade(root, **options):
    return grading.grade("97", root / "submissions", root / "out", probes_dir=root / "probes",
                         labs_dir=root / "labs", solutions_dir=root / "solutions", **options)


def test_resume_grades_only_missing_and_failed_students(graded_once):
    root, out = graded_once
    seed = json.loads((out / "state.json").read_text())["seed"]
    (out / "results" / "partly.json").unlink()
    broken = json.loads((out / "results" / "correct.json").read_text())
    (out / "results" / "correct.json").write_text(json.dumps({**broken, "status": "grader_error"}))
    kept = lab.submission(root, "kept", lab.ADD, lab.RANK_SUM)
    kept_result = out / "results" / "kept.json"
    kept_result.write_text(json.dumps({**broken, "student": "kept", "status": "ok", "seconds": 123.0}))
    _grade(root, resume=True)
    rows = _grades(out)
    assert (rows["correct"]["total"], rows["correct"]["status"]) == ("4", "ok")
    assert (rows["partly"]["total"], rows["partly"]["status"]) == ("2", "ok")
    assert rows["kept"]["seconds"] == "123.0", "a trusted result must not be graded again"
    assert json.loads((out / "state.json").read_text())["seed"] == seed
    kept.unlink()
    kept_result.unlink()


def test_only_regrades_the_named_student(graded_once):
    root, out = graded_once
    before = os.stat(out / "results" / "correct.json").st_mtime_ns
    _grade(root, only=["partly"])
    assert os.stat(out / "results" / "correct.json").st_mtime_ns == before
    assert set(_grades(out)) == set(CLASS)
    with pytest.raises(grading.GradingError, match="--only nobody: no such submission; students: correct, partly"):
        _grade(root, only=["nobody"])


def test_resume_needs_an_earlier_run(tmp_path):
    with pytest.raises(run_state.StateError, match="holds no earlier grading run to continue"):
        run_state.load_or_start(tmp_path, "97", "abc", fresh=False)


def test_changed_probes_refuse_to_resume(graded_once):
    root, out = graded_once
    state = json.loads((out / "state.json").read_text())
    with pytest.raises(run_state.StateError, match="changed since"):
        run_state.load_or_start(out, "97", state["fingerprint"] + "x", fresh=False)


def test_an_overdue_student_is_a_grader_error_and_the_class_goes_on(graded_once):
    root, out = graded_once
    state = json.loads((out / "state.json").read_text())
    import nbformat
    released = nbformat.read(root / "labs" / "97_fixture.ipynb", as_version=4)
    task = Task("97", released, str(root / "probes"), state["expected"], state["seed"], str(out),
                grading.default_limits([root / "probes", root / "solutions", root / "submissions", out]))
    grading.run_class(task, [("partly", str(root / "submissions" / "partly.ipynb"))], jobs=1, hard_limit=0.5)
    [result] = load_results(out, ["partly"])
    assert result["status"] == "grader_error"
    assert "grading took longer than 0 s and was stopped" in result["error"]
    assert "partly: grading took longer" in (out / "logs" / "grader.log").read_text()
