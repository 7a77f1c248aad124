"""What a graded class leaves in OUT: grades.csv, feedback/<student>.md and cells.csv, from results/*.json."""
import csv
import json
import pathlib

from helpers.grading.feedback import feedback_markdown
from helpers.grading.grade_student import result_path


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


def write_outputs(out, probes, results):
    """grades.csv, feedback/*.md and cells.csv from the graded results."""
    out = pathlib.Path(out)
    questions = question_order({p.question for p in probes})
    maximum = sum(p.points for p in probes)
    points = {q: sum(p.points for p in probes if p.question == q) for q in questions}
    with open(out / "grades.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["student", *questions, "total", "max", "status", "seconds"])
        for r in results:
            earned = totals(r, questions)
            writer.writerow([r["student"], *(f"{earned[q]:g}" for q in questions),
                             f"{sum(earned.values()):g}", f"{maximum:g}", r["status"], r["seconds"]])
    for r in results:
        (out / "feedback" / f"{r['student']}.md").write_text(feedback_markdown(r, questions, points))
    with open(out / "cells.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["student", "cell", "kind", "status", "seconds"])
        for r in results:
            for c in r["cells"]:
                writer.writerow([r["student"], c["index"], c["kind"], c["status"], c["seconds"]])


def write_lms(out, results, probes, fmt, *, assignment, deadline=None, per_day=0.0, max_days=0, times=None):
    """OUT/gradebook-<fmt>.csv for an LMS (gradebook.py), the late policy applied when there is a deadline."""
    from helpers.grading.gradebook import Total, apply_late_policy, write_gradebook

    questions = question_order({p.question for p in probes})
    maximum = sum(p.points for p in probes)
    rows = [Total(r["student"], sum(totals(r, questions).values()), maximum, r["status"]) for r in results]
    if deadline is not None:
        rows = apply_late_policy(rows, times or {}, deadline, per_day, max_days)
    return write_gradebook(pathlib.Path(out) / f"gradebook-{fmt}.csv", rows, fmt, assignment, deadline)
