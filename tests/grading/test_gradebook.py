"""Gradebook exports against golden files written from each LMS's documented columns; the late policy."""
import csv
import datetime
import os
import pathlib

import pytest

from helpers.grading.report.gradebook import (
    FORMATS,
    Total,
    apply_late_policy,
    days_late,
    gradebook_rows,
    late_penalty,
    parse_time,
    times_from_csv,
    times_from_mtimes,
    write_gradebook,
)

GOLDEN = pathlib.Path(__file__).parent / "golden"
UTC = datetime.timezone.utc
DEADLINE = datetime.datetime(2026, 3, 2, 0, 0, tzinfo=UTC)

# The header each LMS documents (see the module docstring for the pages); the golden files must start with it.
DOCUMENTED_HEADER = {
    "canvas": ["Student", "ID", "SIS User ID", "SIS Login ID", "Section"],
    "gradescope": ["Name", "SID", "Email", "Total Score", "Max Points", "Status", "Submission Time",
                   "Lateness (H:M:S)"],
    "moodle": ["ID number", "Email address"],
    "csv": ["student", "points", "max", "percent", "status", "submitted", "late_days", "penalty"],
}


def at(text):
    return datetime.datetime.fromisoformat(text).replace(tzinfo=UTC)


def the_class():
    """Four students: on time, missing, a grader error (an email id), two days late."""
    return [
        Total("dave", 6, 10, "timeout", at("2026-03-03T01:30:00")),
        Total("alice", 7.5, 10, "ok", at("2026-03-01T23:00:00")),
        Total("bob", 0, 10, "missing"),
        Total("carol@example.edu", 0, 10, "grader_error", at("2026-03-01T12:00:00")),
    ]


def graded_class():
    return apply_late_policy(the_class(), {}, DEADLINE, per_day=0.2, max_days=3)


@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_export_matches_golden_file(fmt, tmp_path):
    assignment = "Lab 03 (1234)"  # Canvas names an existing assignment "Name (id)"
    path = write_gradebook(tmp_path / f"{fmt}.csv", graded_class(), fmt, assignment, deadline=DEADLINE)
    golden = GOLDEN / f"{fmt}.csv"
    assert path.read_text(encoding="utf-8") == golden.read_text(encoding="utf-8"), (
        f"{fmt} export differs from {golden}:\n{path.read_text()}")
    with open(path, newline="", encoding="utf-8") as f:
        header = next(csv.reader(f))
    documented = DOCUMENTED_HEADER[fmt]
    assert header[:len(documented)] == documented, f"{fmt} header {header}, documented {documented}"
    if fmt in ("canvas", "moodle"):
        assert header[len(documented):] == [assignment], "one column per grade item, named as in the LMS"


def test_grader_error_is_left_blank_and_missing_is_zero():
    rows = {r[2]: r[5] for r in gradebook_rows(graded_class(), "canvas", "Lab 03")[1:]}
    assert rows["carol@example.edu"] == "", "no grade yet: an import must not overwrite a grade with 0"
    assert rows["bob"] == "0"


def test_bad_format_and_assignment_say_what_to_pass():
    with pytest.raises(ValueError, match="pass one of canvas, gradescope, moodle, csv"):
        gradebook_rows(the_class(), "blackboard", "Lab 03")
    with pytest.raises(ValueError, match="assignment's column name"):
        gradebook_rows(the_class(), "canvas", "")


@pytest.mark.parametrize("submitted, days, penalty", [
    ("2026-03-01T12:00:00", 0, 0.0),          # early
    ("2026-03-02T00:00:00", 0, 0.0),          # exactly at the deadline
    ("2026-03-02T00:00:01", 1, 0.1),          # one second late is one day
    ("2026-03-03T00:00:00", 1, 0.1),          # exactly 24 h
    ("2026-03-03T00:00:01", 2, 0.2),
    ("2026-03-05T00:00:00", 3, 0.3),          # the last day that still counts
    ("2026-03-05T00:00:01", 4, 1.0),          # past max_days: nothing
])
def test_late_penalty(submitted, days, penalty):
    assert days_late(at(submitted), DEADLINE) == days
    assert late_penalty(at(submitted), DEADLINE, per_day=0.1, max_days=3) == pytest.approx(penalty)


def test_late_penalty_caps_at_everything_and_checks_its_arguments():
    assert late_penalty(at("2026-03-04T00:00:00"), DEADLINE, per_day=0.6, max_days=5) == 1.0
    assert late_penalty(None, DEADLINE, 0.1, 3) == 0.0
    with pytest.raises(ValueError, match="fraction per day"):
        late_penalty(at("2026-03-04T00:00:00"), DEADLINE, per_day=10, max_days=3)


def test_apply_late_policy_takes_times_from_the_mapping():
    totals = [Total("alice", 8, 10), Total("bob", 8, 10)]
    times = {"alice": at("2026-03-01T00:00:00"), "bob": at("2026-03-02T12:00:00")}
    alice, bob = apply_late_policy(totals, times, DEADLINE, per_day=0.25, max_days=2)
    assert (alice.points, alice.late_days, alice.penalty) == (8, 0, 0)
    assert (bob.points, bob.late_days, bob.penalty) == (6, 1, 0.25)
    assert bob.submitted == times["bob"]


def test_times_from_mtimes(tmp_path):
    path = tmp_path / "alice.ipynb"
    path.write_text("{}")
    stamp = at("2026-03-02T06:00:00").timestamp()
    os.utime(path, (stamp, stamp))
    assert times_from_mtimes([path]) == {"alice": at("2026-03-02T06:00:00")}


def test_times_from_csv(tmp_path):
    path = tmp_path / "times.csv"
    path.write_text("student,submitted_iso\nalice,2026-03-02T06:00:00\nbob,2026-03-02T08:00:00+02:00\n")
    assert times_from_csv(path) == {"alice": at("2026-03-02T06:00:00"), "bob": at("2026-03-02T06:00:00")}
    path.write_text("student,when\nalice,2026-03-02\n")
    with pytest.raises(ValueError, match=r"missing \['submitted_iso'\]"):
        times_from_csv(path)
    path.write_text("student,submitted_iso\nalice,yesterday\n")
    with pytest.raises(ValueError, match=r"times.csv:2: submitted_iso='yesterday'"):
        times_from_csv(path)


def test_parse_time_reads_naive_times_as_utc():
    assert parse_time("2026-03-02T00:00:00") == DEADLINE
    assert parse_time("2026-03-02T01:00:00+01:00") == DEADLINE
