"""make grade FORMAT=...: the graded results become an LMS import file, with the late policy applied."""
import csv
import datetime

from helpers.grading import grade as grading
from helpers.grading.probes import Probe
from helpers.grading.report import write_lms

UTC = datetime.timezone.utc
PROBES = [Probe("3.1", "a", "x", points=3), Probe("3.2", "b", "x", points=7)]


def _result(student, earned, status="ok"):
    return {"student": student, "status": status,
            "marks": {"3.1": [{"earned": earned[0]}], "3.2": [{"earned": earned[1]}]}}


def test_canvas_file_with_a_late_penalty(tmp_path):
    deadline = datetime.datetime(2026, 12, 1, tzinfo=UTC)
    times = {"ada": deadline - datetime.timedelta(hours=1), "bob": deadline + datetime.timedelta(hours=30)}
    path = write_lms(tmp_path, [_result("ada", (3, 7)), _result("bob", (3, 5)), _result("cy", (0, 0), "grader_error")],
                     PROBES, "canvas", assignment="Lab 03", deadline=deadline, per_day=0.1, max_days=7, times=times)
    with open(path) as f:
        rows = list(csv.reader(f))
    assert rows[0][-1] == "Lab 03" and path.name == "gradebook-canvas.csv"
    scores = {row[2]: row[-1] for row in rows[1:]}  # the id goes in "SIS User ID"
    assert scores == {"ada": "10", "bob": "6.4", "cy": ""}, rows  # bob: 2 days started late, 20 % off 8


def test_the_cli_names_its_formats():
    parser_error = None
    try:
        grading.main(["--lab", "3", "--submissions", "/nonexistent", "--out", "/tmp/x", "--format", "blackboard"])
    except SystemExit as exc:
        parser_error = exc.code
    assert parser_error == 2
