"""What a graded class leaves in OUT: grades.csv, feedback/<student>.md and cells.csv, from results/*.json.

A lab with parts graded by hand (helpers/grading/manual.py) also gets OUT/manual.csv and the students' texts; its
grades.csv has a column "<question> (by hand)" per part, the points entered (empty while pending), and a `by_hand`
column, `pending` or `graded`; `total` counts the points known, `max` all of them.
"""
import json
import pathlib

from helpers.grading import manual
from helpers.grading.feedback import feedback_markdown
from helpers.grading.grade_student import result_path
from helpers.grading.spreadsheet import write_csv


def question_order(questions):
    """"3.10" after "3.9"."""
    return sorted(questions, key=lambda q: [int(x) for x in q.split(".")])


def load_results(out, students):
    """The result of every student, in order (a student without one is a grader_error)."""
    results = []
    for student in students:
        try:
            results.append(json.loads(result_path(out, student).read_text()))
        except (OSError, ValueError):
            results.append({"student": student, "status": "grader_error", "marks": {}, "missing": [], "cells": [],
                            "seconds": 0.0, "error": "no result was recorded (grading was interrupted?)"})
    return results


def totals(result, questions):
    """{question: points earned} of one result."""
    return {q: sum(m["earned"] for m in result["marks"].get(q, [])) for q in questions}


def write_outputs(out, probes, results, items=()):
    """grades.csv, feedback/*.md and cells.csv from the graded results; items: the parts graded by hand."""
    out = pathlib.Path(out)
    questions = question_order({p.question for p in probes})
    maximum = sum(p.points for p in probes) + sum(item.points for item in items)
    points = {q: sum(p.points for p in probes if p.question == q) for q in questions}
    entered = manual.write_sheet(out, items, results) if items else {}
    by_hand = [f"{item.question} (by hand)" for item in items]
    rows = [["student", *questions, *by_hand, "total", "max", "status", "seconds", *(["by_hand"] if items else [])]]
    for r in results:
        earned = totals(r, questions)
        hand, complete = manual.earned(entered, r["student"], items)
        known = sum(earned.values()) + sum(v for v in hand.values() if v is not None)
        rows.append([r["student"], *(f"{earned[q]:g}" for q in questions),
                     *("" if v is None else f"{v:g}" for v in hand.values()),
                     f"{known:g}", f"{maximum:g}", r["status"], r["seconds"],
                     *([("graded" if complete else "pending")] if items else [])])
    write_csv(out / "grades.csv", rows)
    for r in results:
        hand = manual.earned(entered, r["student"], items)[0]
        text = feedback_markdown(r, questions, points, [(item, hand[item.question]) for item in items])
        (out / "feedback" / f"{r['student']}.md").write_text(text)
    write_csv(out / "cells.csv", [["student", "cell", "kind", "status", "seconds"],
                                  *([r["student"], c["index"], c["kind"], c["status"], c["seconds"]]
                                    for r in results for c in r["cells"])])


def write_lms(out, results, probes, fmt, *, assignment, deadline=None, per_day=0.0, max_days=0, times=None,
              items=()):
    """OUT/gradebook-<fmt>.csv for an LMS (gradebook.py), the late policy applied when there is a deadline.

    items: the parts graded by hand; a student with one still pending gets no grade yet (status manual_pending)."""
    from helpers.grading.gradebook import Total, apply_late_policy, write_gradebook

    questions = question_order({p.question for p in probes})
    maximum = sum(p.points for p in probes) + sum(item.points for item in items)
    entered = manual.read_points(out, items) if items else {}
    rows = []
    for r in results:
        hand, complete = manual.earned(entered, r["student"], items)
        points = sum(totals(r, questions).values()) + sum(v for v in hand.values() if v is not None)
        status = r["status"] if complete or r["status"] == "grader_error" else "manual_pending"
        rows.append(Total(r["student"], points, maximum, status))
    if deadline is not None:
        rows = apply_late_policy(rows, times or {}, deadline, per_day, max_days)
    return write_gradebook(pathlib.Path(out) / f"gradebook-{fmt}.csv", rows, fmt, assignment, deadline)
