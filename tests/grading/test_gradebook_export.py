"""make grade FORMAT=... DEADLINE=...: the late policy reaches every place the score is (grades.csv, results, feedback,
the LMS file), one number for all; tested on the report stage with synthetic results (no kernel)."""
import csv
import datetime
import json
import re

import pytest

from helpers.grading import grade as grading
from helpers.grading.probes import Probe
from helpers.grading.report.gradebook import AFTER_RUN, NO_TIME, LatePolicy, lateness
from helpers.grading.report.report import write_lms, write_outputs
from helpers.grading.run.grade_student import write_result

UTC = datetime.timezone.utc
PROBES = [Probe("3.1", "a", "x", points=3), Probe("3.2", "b", "x", points=7)]
DEADLINE = datetime.datetime(2026, 12, 1, tzinfo=UTC)
NOW = datetime.datetime(2026, 12, 20, tzinfo=UTC)  # the grading run


def _result(student, earned, status="ok"):
    return {"student": student, "status": status, "seconds": 1.0, "cells": [], "missing": [],
            "marks": {"3.1": [{"name": "a", "points": 3, "earned": earned[0], "message": "wrong value"}],
                      "3.2": [{"name": "b", "points": 7, "earned": earned[1], "message": "wrong value"}]}}


def _graded_class(tmp_path, per_day=0.1, max_days=7):
    """Six students through the report stage, as grade.py runs it: lateness, grades.csv and feedback, results."""
    for sub in ("feedback", "results"):
        (tmp_path / sub).mkdir()
    hours = datetime.timedelta(hours=1)
    times = {"ada": DEADLINE - hours, "bob": DEADLINE + 30 * hours, "frank": DEADLINE + 14 * hours,
             "gus": DEADLINE + 9 * 24 * hours, "hal": datetime.datetime(2099, 1, 1, tzinfo=UTC)}
    results = [_result("ada", (3, 7)), _result("bob", (3, 5)), _result("cy", (0, 0), "grader_error"),
               _result("frank", (2, 3)), _result("gus", (3, 7)), _result("hal", (3, 7))]
    policy = LatePolicy(DEADLINE, per_day, max_days)
    for r in results:
        r.update(lateness(times.get(r["student"]), policy, NOW))
    write_outputs(tmp_path, PROBES, results)
    for r in results:
        write_result(tmp_path, r)
    return results


def _csv(path, key):
    with open(path) as f:
        return {row[key]: row for row in csv.DictReader(f)}


def test_grades_results_feedback_and_canvas_agree_on_the_late_score(tmp_path):
    results = _graded_class(tmp_path)
    lms = write_lms(tmp_path, results, PROBES, "canvas", assignment="Lab 03 (1234)")
    grades = _csv(tmp_path / "grades.csv", "student")
    canvas = {row["SIS User ID"]: row["Lab 03 (1234)"] for row in _csv(lms, "SIS User ID").values()}
    frank = grades["frank"]
    assert (frank["total"], frank["late_days"], frank["penalty"], frank["final"]) == ("5", "1", "0.1", "4.5"), frank
    assert frank["submitted"] == "2026-12-01T14:00:00+00:00" and frank["time_note"] == ""
    saved = json.loads((tmp_path / "results" / "frank.json").read_text())
    assert (saved["submitted"], saved["late_days"], saved["penalty"], saved["final"]) == (
        "2026-12-01T14:00:00+00:00", 1, 0.1, 4.5)
    feedback = (tmp_path / "feedback" / "frank.md").read_text().splitlines()
    assert feedback[2].startswith("Score: 5 / 10.") and feedback[4] == "Submitted 14 h late: -10 %, 4.5 / 10.", feedback
    assert canvas["frank"] == "4.5"
    # every student: the LMS file holds grades.csv's final (blank: no grade yet), bob 2 days started late
    assert {s: row["final"] for s, row in grades.items()} == {"ada": "10", "bob": "6.4", "cy": "0", "frank": "4.5",
                                                              "gus": "0", "hal": "10"}
    assert canvas == {s: ("" if s == "cy" else row["final"]) for s, row in grades.items()}, canvas
    assert "Submitted on time: 10 / 10." in (tmp_path / "feedback" / "ada.md").read_text()
    assert "Submitted 9 days late: -100 %, 0 / 10." in (tmp_path / "feedback" / "gus.md").read_text()


def test_a_time_after_the_grading_run_is_flagged_not_charged(tmp_path):
    results = _graded_class(tmp_path)
    hal = _csv(tmp_path / "grades.csv", "student")["hal"]
    assert (hal["late_days"], hal["penalty"], hal["final"], hal["time_note"]) == ("0", "0", "10", AFTER_RUN), hal
    assert (f"Submission time (2099-01-01T00:00:00+00:00): {AFTER_RUN}; 10 / 10."
            in (tmp_path / "feedback" / "hal.md").read_text())
    cy = _csv(tmp_path / "grades.csv", "student")["cy"]  # absent from the times: no time, nothing charged, said
    assert (cy["submitted"], cy["time_note"]) == ("", NO_TIME)
    gradescope = _csv(write_lms(tmp_path, results, PROBES, "gradescope", assignment="x"), "SID")
    assert (gradescope["frank"]["Total Score"], gradescope["frank"]["Lateness (H:M:S)"]) == ("4.5", "14:00:00")


def test_without_a_deadline_grades_csv_keeps_its_columns_and_final_is_the_total(tmp_path):
    for sub in ("feedback", "results"):
        (tmp_path / sub).mkdir()
    results = [_result("ada", (3, 5))]
    write_outputs(tmp_path, PROBES, results)
    with open(tmp_path / "grades.csv") as f:
        assert next(csv.reader(f)) == ["student", "3.1", "3.2", "total", "max", "status", "seconds"]
    assert results[0]["final"] == 8 and "Submitted" not in (tmp_path / "feedback" / "ada.md").read_text()
    lms = write_lms(tmp_path, results, PROBES, "moodle", assignment="Lab 03")
    assert _csv(lms, "ID number")["ada"]["Lab 03"] == "8"


@pytest.mark.parametrize("options, message", [
    (grading.Options(deadline="friday"), "DEADLINE='friday' is not an ISO 8601 time: pass e.g. 2026-12-01T23:59+01:00"),
    (grading.Options(deadline="2026-12-01", late_per_day=10), "LATE_PER_DAY=10: pass a fraction of the points per day "
                                                              "in [0, 1], e.g. 0.1 for 10 % a day"),
    (grading.Options(deadline="2026-12-01", late_max_days=-1), "LATE_MAX_DAYS=-1: pass a number of days >= 0"),
    (grading.Options(late_per_day=0.2), "LATE_PER_DAY, LATE_MAX_DAYS and TIMES apply a late policy: pass its DEADLINE"),
    (grading.Options(format="blackboard"), "FORMAT=blackboard: pass one of canvas, gradescope, moodle, csv"),
])
def test_bad_options_are_refused_before_grading(options, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        options.check("03")


def test_options_not_given_are_the_runs_own():
    earlier = {"format": "canvas", "assignment": "Lab 03 (12)", "deadline": "2026-12-01", "late_per_day": 0.2}
    merged = grading.Options(late_per_day=0.3).merged(earlier)
    assert (merged.format, merged.assignment, merged.late_per_day, merged.late_max_days) == ("canvas", "Lab 03 (12)",
                                                                                            0.3, None)
    assert merged.late_policy() == LatePolicy(DEADLINE, 0.3, 7)


def test_the_cli_names_its_formats():
    parser_error = None
    try:
        grading.main(["--lab", "3", "--submissions", "/nonexistent", "--out", "/tmp/x", "--format", "blackboard"])
    except SystemExit as exc:
        parser_error = exc.code
    assert parser_error == 2
