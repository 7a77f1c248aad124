"""`make grade` passes every option an instructor needs to the grader (a dry run, parsed by the grader's own parser)."""
import shlex
import subprocess

import pytest

from helpers.grading import grade as grading
from helpers.grading.prepare.labgen import ROOT

pytestmark = pytest.mark.timeout(60)
NO_SETUP = ("-o", "setup", "-o", ".venv/.installed")  # never (re)install the course here


def _command(*variables):
    """The grader's arguments in `make -n grade` with these variables."""
    dry = subprocess.run(["make", "-n", "-s", *NO_SETUP, "grade", *variables], cwd=ROOT, capture_output=True,
                         text=True, check=True)
    line = " ".join(dry.stdout.replace("\\\n", " ").split())
    return shlex.split(line[line.index("-m helpers.grading.grade") + len("-m helpers.grading.grade"):])


def test_every_variable_reaches_the_grader():
    options = grading.arguments().parse_args(_command(
        "LAB=03", "SUBMISSIONS=my class", "OUT=out dir", "PROBES=private", "SOLUTIONS=sol", "JOBS=3",
        "ONLY=alice bob", "FORMAT=canvas", "ASSIGNMENT=Lab 03 (12345)", "DEADLINE=2026-12-01T23:59+01:00",
        "LATE_PER_DAY=0.2", "LATE_MAX_DAYS=5", "TIMES=times.csv"))
    assert (options.lab, options.submissions, options.out, options.probes, options.solutions, options.jobs) == (
        "03", "my class", "out dir", "private", "sol", 3)
    assert (options.only, options.resume, options.fresh) == (["alice", "bob"], False, False)
    assert (options.format, options.assignment, options.deadline) == ("canvas", "Lab 03 (12345)",
                                                                      "2026-12-01T23:59+01:00")
    assert (options.late_per_day, options.late_max_days, options.times) == (0.2, 5, "times.csv")
    fresh = grading.arguments().parse_args(_command("LAB=03", "SUBMISSIONS=s", "OUT=o", "FRESH=1", "RESUME="))
    assert (fresh.fresh, fresh.resume, fresh.jobs, fresh.late_per_day, fresh.assignment) == (True, False, 2, None, None)


def test_without_its_three_folders_make_grade_says_how_to_call_it():
    dry = subprocess.run(["make", "-s", *NO_SETUP, "grade", "LAB=03"], cwd=ROOT, capture_output=True, text=True)
    assert dry.returncode != 0 and dry.stdout.startswith("usage: make grade LAB=03 SUBMISSIONS=dir OUT=dir")
    for option in ("JOBS=", "FRESH=1", "ASSIGNMENT=", "LATE_PER_DAY=", "LATE_MAX_DAYS="):
        assert option in dry.stdout, option


def test_the_guides_show_every_option():
    instructors, grading_md = (ROOT / "INSTRUCTORS.md").read_text(), (ROOT / "GRADING.md").read_text()
    for option in ("JOBS=", "FRESH=1", "ASSIGNMENT=", "DEADLINE=", "LATE_PER_DAY=", "LATE_MAX_DAYS=", "TIMES=", "ONLY=",
                   "RESUME=1", "FORMAT=", "SHARD="):
        assert option in instructors and f"`{option}" in grading_md, option
