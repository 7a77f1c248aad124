"""Gradebook files for an LMS, and a late policy: pure functions of per-student totals.

A `Total` is one student's result for one lab (what grades.csv says): id, points, max, status, and when the
submission was made. `gradebook_rows(totals, fmt, assignment)` turns a class into the rows of an import file,
`write_gradebook(path, ...)` writes them (UTF-8, comma-separated, a header row). The columns follow each
LMS's documented import format:

| fmt        | columns                                                       | the LMS matches students by |
|------------|---------------------------------------------------------------|-----------------------------|
| canvas     | Student, ID, SIS User ID, SIS Login ID, Section, <assignment> | SIS User ID (the id)        |
| gradescope | Name, SID, Email, Total Score, Max Points, Status,            | Email when the id is one,   |
|            |   Submission Time, Lateness (H:M:S)                           |   else SID                  |
| moodle     | ID number, Email address, <assignment>                        | ID number -> useridnumber,  |
|            |                                                               |   Email address -> useremail|
| csv        | student, points, max, percent, status, submitted, late_days,  | (plain, for anything else)  |
|            |   penalty                                                     |                             |

Sources, read for these columns:
- Canvas: the Gradebook import needs the student columns Student Name, Student ID or SIS User ID (one of
  them identifies the student), SIS Login ID and Section, then one column per assignment; a column whose name
  matches no assignment creates one, an existing one is named "Name (assignment id)" as in Canvas's export:
  https://teaching.resources.osu.edu/toolsets/carmencanvas/guides/calculating-final-grades/
  import-csv-file-carmen-grades
  (Canvas's own guide: "How do I import grades in the Gradebook?", community.canvaslms.com Instructor Guide).
- Gradescope: students are identified by Email (required in a roster) or SID:
  https://help.gradescope.com/article/w59nl02vyt-instructor-course-add-members
  The score columns are those of Gradescope's own assignment export (SID, score, "Max Points",
  "Submission Time", "Lateness (H:M:S)"), as documented by a course that consumes it:
  https://github.com/cs161-staff/grades-py (README, "Gradescope Grades"). Gradescope's own page for
  uploading scores was not among the sources read: upload one file first and check it.
- Moodle: "Grade import", CSV import maps a user column ("Email address" -> useremail, or "ID number" ->
  useridnumber) and one column per grade item, chosen in the import preview:
  https://docs.moodle.org/311/en/Grade_import

The assignment's column (`make grade ASSIGNMENT=...`, default "Lab NN"), per LMS:
- canvas: the header of an existing assignment's column is "Name (assignment id)", as Canvas's own gradebook export
  writes it (e.g. "Lab 03 (12345)": export the gradebook once and copy the header); a name without its id imports as a
  new assignment, and `make grade` says so.
- moodle: the column is mapped to a grade item in the import preview, so its name is free ("Lab 03" is fine).
- gradescope: no assignment column (the file is uploaded to one assignment: Total Score); the name is not used.
- csv: the name is not used (the columns are the grader's own).
The student's id is the submission's file name: Canvas matches it to the SIS User ID, Moodle to the ID number (or the
email address when the id is one), Gradescope to the SID (or the email).

A `grader_error` row has no grade yet (the grader failed, not the student): it is left blank in the LMS files,
so an import changes nothing for that student until they are re-graded. So is a `manual_pending` row: a lab with
a part graded by hand (helpers/grading/report/manual.py) whose points are not entered yet. Every other status keeps its
points (a missing submission has 0).

The late policy (`late_penalty`, `apply_late_policy`): a submission `d` started days after the deadline loses
`per_day` x d of its points (d rounded up to whole days: one second late is one day); past `max_days` it
scores 0. Submission times come from the files' mtimes (`times_from_mtimes`) or from a CSV with the
columns student,submitted_iso (`times_from_csv`); times without an offset are read as UTC. `lateness` records one
student's (a time after the grading run, or none, is charged nothing and noted in `time_note`).
"""
import csv
import dataclasses
import datetime
import math
import pathlib

from helpers.grading.report.spreadsheet import original, write_csv

UTC = datetime.timezone.utc
DAY_S = 86400
NO_GRADE = {"grader_error", "manual_pending"}  # statuses with no grade to upload


@dataclasses.dataclass(frozen=True)
class Total:
    """One student's result for one lab."""

    student: str
    points: float
    max_points: float
    status: str = "ok"
    submitted: datetime.datetime | None = None
    late_days: int = 0
    penalty: float = 0.0  # fraction of the points taken by the late policy


def number(x):
    """Points as an LMS reads them: 3, 2.5, 2.25 (at most two decimals, no trailing zeros)."""
    text = f"{round(float(x), 2):.2f}".rstrip("0").rstrip(".")
    return "0" if text in ("", "-0") else text


def iso(when):
    """A time as ISO 8601 in UTC, to the second, or '' when unknown."""
    return "" if when is None else when.astimezone(UTC).replace(microsecond=0).isoformat()


def hms(seconds):
    """A duration as Gradescope's Lateness column writes it, H:M:S."""
    seconds = max(0, int(seconds))
    return f"{seconds // 3600:02d}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


def score(total):
    """The points to upload, or '' when there is no grade (grader_error)."""
    return "" if total.status in NO_GRADE else number(total.points)


def canvas_rows(totals, assignment, deadline=None):
    header = ["Student", "ID", "SIS User ID", "SIS Login ID", "Section", assignment]
    return [header] + [["", "", t.student, "", "", score(t)] for t in totals]


def gradescope_rows(totals, assignment, deadline=None):
    header = ["Name", "SID", "Email", "Total Score", "Max Points", "Status", "Submission Time",
              "Lateness (H:M:S)"]
    rows = [header]
    for t in totals:
        email = t.student if "@" in t.student else ""
        late = (t.submitted - deadline).total_seconds() if t.submitted and deadline else 0
        rows.append(["", "" if email else t.student, email, score(t), number(t.max_points),
                     "Graded" if t.status not in NO_GRADE else "Ungraded", iso(t.submitted), hms(late)])
    return rows


def moodle_rows(totals, assignment, deadline=None):
    header = ["ID number", "Email address", assignment]
    rows = [header]
    for t in totals:
        email = t.student if "@" in t.student else ""
        rows.append(["" if email else t.student, email, score(t)])
    return rows


def plain_rows(totals, assignment, deadline=None):
    header = ["student", "points", "max", "percent", "status", "submitted", "late_days", "penalty"]
    rows = [header]
    for t in totals:
        percent = 100 * t.points / t.max_points if t.max_points else 0.0
        rows.append([t.student, number(t.points), number(t.max_points), number(percent), t.status,
                     iso(t.submitted), t.late_days, number(t.penalty)])
    return rows


FORMATS = {"canvas": canvas_rows, "gradescope": gradescope_rows, "moodle": moodle_rows, "csv": plain_rows}


def gradebook_rows(totals, fmt, assignment, deadline=None):
    """Header and one row per student (sorted by id) of the import file for fmt."""
    if fmt not in FORMATS:
        raise ValueError(f"format {fmt!r}: no such gradebook format; pass one of {', '.join(FORMATS)}")
    if not assignment:
        raise ValueError("assignment='': the LMS needs the assignment's column name, e.g. 'Lab 03'")
    return FORMATS[fmt](sorted(totals, key=lambda t: t.student), assignment, deadline)


def write_gradebook(path, totals, fmt, assignment, deadline=None):
    """Write the import file for fmt at path; returns the path."""
    return write_csv(pathlib.Path(path), gradebook_rows(totals, fmt, assignment, deadline), lineterminator="\n")


# --- late policy -------------------------------------------------------------------------------------------

def parse_time(text):
    """An ISO 8601 time; without an offset it is UTC."""
    when = datetime.datetime.fromisoformat(text.strip())
    return when if when.tzinfo else when.replace(tzinfo=UTC)


def days_late(submitted, deadline):
    """Whole days started after the deadline: 0 on time, 1 for one second to 24 h late."""
    return max(0, math.ceil((submitted - deadline).total_seconds() / DAY_S))


def late_penalty(submitted, deadline, per_day, max_days):
    """The fraction of the points lost: per_day per day started late, all of them after max_days."""
    if not 0 <= per_day <= 1 or max_days < 0:
        raise ValueError(f"per_day={per_day}, max_days={max_days}: pass a fraction per day in [0, 1] "
                         f"(e.g. 0.1) and a number of days >= 0")
    if submitted is None:
        return 0.0  # no time known: nothing to charge
    days = days_late(submitted, deadline)
    return 1.0 if days > max_days else min(1.0, days * per_day)


@dataclasses.dataclass(frozen=True)
class LatePolicy:
    """A deadline, the fraction of the points lost per day started late, and the days after which nothing is left."""

    deadline: datetime.datetime
    per_day: float = 0.1
    max_days: int = 7

    def __post_init__(self):
        late_penalty(None, self.deadline, self.per_day, self.max_days)  # checks the numbers before any grading


AFTER_RUN = "after the grading run: not charged, check this time"
NO_TIME = "no submission time: not charged"


def lateness(submitted, policy, now):
    """One student's lateness under policy, as grades.csv and results/<student>.json record it:
    {"submitted", "deadline" (ISO or ''), "late_days", "penalty" (a fraction), "time_note" ('' when charged)}.

    A time after `now` (the grading run's start: a file's clock in 2099) is charged nothing and noted, as is none."""
    row = {"submitted": iso(submitted), "deadline": iso(policy.deadline), "late_days": 0, "penalty": 0.0,
           "time_note": ""}
    if submitted is None or submitted > now:
        return {**row, "time_note": NO_TIME if submitted is None else AFTER_RUN}
    return {**row, "late_days": days_late(submitted, policy.deadline),
            "penalty": late_penalty(submitted, policy.deadline, policy.per_day, policy.max_days)}


def apply_late_policy(totals, times, deadline, per_day, max_days):
    """Totals with submission times from `times` (student -> datetime) and the late penalty taken off."""
    out = []
    for t in totals:
        submitted = times.get(t.student, t.submitted)
        penalty = late_penalty(submitted, deadline, per_day, max_days)
        days = days_late(submitted, deadline) if submitted else 0
        out.append(dataclasses.replace(t, submitted=submitted, late_days=days, penalty=penalty,
                                       points=round(t.points * (1 - penalty), 2)))
    return out


def times_from_mtimes(paths):
    """Submission times from the files' modification times: student id (file stem) -> UTC datetime."""
    return {pathlib.Path(p).stem: datetime.datetime.fromtimestamp(pathlib.Path(p).stat().st_mtime, UTC)
            for p in paths}


def times_from_csv(path):
    """Submission times from a CSV with the columns student,submitted_iso."""
    with open(path, newline="", encoding="utf-8") as f:
        reader = csv.DictReader(f)
        missing = {"student", "submitted_iso"} - set(reader.fieldnames or [])
        if missing:
            raise ValueError(f"{path}: columns {reader.fieldnames}, missing {sorted(missing)}; "
                             f"write a header 'student,submitted_iso' and one row per submission")
        times = {}
        for line, row in enumerate(reader, start=2):
            try:
                times[original(row["student"].strip())] = parse_time(row["submitted_iso"])
            except ValueError as error:
                raise ValueError(f"{path}:{line}: submitted_iso={row['submitted_iso']!r} is not an ISO 8601 "
                                 f"time ({error}); write e.g. 2026-03-01T23:59:00+00:00") from None
        return times
