"""What a graded class leaves in OUT: grades.csv, feedback/<student>.md and cells.csv, from results/*.json.

A lab with parts graded by hand (helpers/grading/report/manual.py) also gets OUT/manual.csv and the students' texts; its
grades.csv has a column "<question> (by hand)" per part, the points entered (empty while pending), and a `by_hand`
column, `pending` or `graded`; `total` counts the points known, `max` all of them.

With a late policy (helpers/grading/report/gradebook.py), each result carries its lateness (`submitted`, `deadline`,
`late_days`, `penalty`, `time_note`) and grades.csv has it too, with `final`: the points known after the penalty,
the number the feedback states and the LMS file holds.
"""
import json
import pathlib

from helpers.grading.judge.redact import Secrets
from helpers.grading.prepare.submissions import scrub
from helpers.grading.report import manual
from helpers.grading.report.feedback import code, feedback_markdown
from helpers.grading.report.gradebook import Total, number, parse_time, write_gradebook
from helpers.grading.report.spreadsheet import write_csv
from helpers.grading.run.grade_student import result_path


def question_order(questions):
    """"3.10" after "3.9"."""
    return sorted(questions, key=lambda q: [int(x) for x in q.split(".")])


def load_results(out, students):
    """The result of every student, in order (a student without one is a grader_error)."""
    results = []
    for student in students:
        try:  # an earlier grader's result may hold half a surrogate pair, escaped: no file could be written from it
            results.append(scrub(json.loads(result_path(out, student).read_text())))
        except (OSError, ValueError):
            results.append({"student": student, "status": "grader_error", "marks": {}, "missing": [], "cells": [],
                            "seconds": 0.0, "error": "no result was recorded (grading was interrupted?)"})
    return results


def totals(result, questions):
    """{question: points earned} of one result."""
    return {q: sum(m["earned"] for m in result["marks"].get(q, [])) for q in questions}


LATE_COLUMNS = ["submitted", "late_days", "penalty", "final", "time_note"]


def final_points(result, known):
    """The points after the late penalty the result carries (none: all of them), as the LMS file writes them."""
    return round(known * (1 - float(result.get("penalty") or 0.0)), 2)


def _scored(result, questions, entered, items):
    """({question: earned}, {by-hand question: points or None}, points known, whether every part is graded)."""
    earned = totals(result, questions)
    hand, complete = manual.earned(entered, result["student"], items)
    return earned, hand, sum(earned.values()) + sum(v for v in hand.values() if v is not None), complete


def write_outputs(out, probes, results, items=()):
    """grades.csv, feedback/*.md and cells.csv from the graded results; items: the parts graded by hand.

    Sets each result's `final` (the points after its late penalty: gradebook.lateness); results with a penalty (a
    late policy applies) add the columns LATE_COLUMNS to grades.csv."""
    out = pathlib.Path(out)
    questions = question_order({p.question for p in probes})
    maximum = sum(p.points for p in probes) + sum(item.points for item in items)
    points = {q: sum(p.points for p in probes if p.question == q) for q in questions}
    entered = manual.write_sheet(out, items, results) if items else {}
    by_hand = [f"{item.question} (by hand)" for item in items]
    late = any("penalty" in r for r in results)
    rows = [["student", *questions, *by_hand, "total", "max", "status", "seconds", *(["by_hand"] if items else []),
             *(LATE_COLUMNS if late else [])]]
    for r in results:
        earned, hand, known, complete = _scored(r, questions, entered, items)
        r["final"] = final_points(r, known)
        rows.append([r["student"], *(f"{earned[q]:g}" for q in questions),
                     *("" if v is None else f"{v:g}" for v in hand.values()),
                     f"{known:g}", f"{maximum:g}", r["status"], r["seconds"],
                     *([("graded" if complete else "pending")] if items else []),
                     *([r.get("submitted", ""), r.get("late_days", 0), number(r.get("penalty") or 0),
                        number(r["final"]), r.get("time_note", "")] if late else [])])
    write_csv(out / "grades.csv", rows)
    for r in results:
        try:  # one student's feedback never costs the class its reports (issue 29)
            hand = manual.earned(entered, r["student"], items)[0]
            # Every text from the kernel passes the student's own secrets again (redact.py): its executed probe cells.
            secrets = Secrets.of_file(out / "executed" / f"{r['student']}.ipynb",
                                      seeds=[r["probe_seed"]] if r.get("probe_seed") else [])
            text = feedback_markdown(r, questions, points, [(item, hand[item.question]) for item in items], secrets)
        except Exception as exc:  # noqa: BLE001 - said in the feedback and in logs/grader.log
            text = no_feedback(out, r, exc)
        (out / "feedback" / f"{r['student']}.md").write_text(text, encoding="utf-8", errors="replace")
    write_csv(out / "cells.csv", [["student", "cell", "kind", "status", "seconds"],
                                  *([r["student"], c["index"], c["kind"], c["status"], c["seconds"]]
                                    for r in results for c in r["cells"])])


def no_feedback(out, result, exc):
    """The feedback of a student whose own could not be written: their points, and why, also in logs/grader.log."""
    why = f"the grader could not write this feedback ({type(exc).__name__})"
    with open(pathlib.Path(out) / "logs" / "grader.log", "a", encoding="utf-8", errors="replace") as log:
        log.write(f"{result.get('student')}: {why}: {exc}\n")
    return (f"# Feedback for {code(result.get('student'))}\n\nScore: {result.get('final', 0):g} (grades.csv has each "
            f"question's points). Status: {result.get('status')}.\n\nThe g{why[5:]}: ask your instructor for it.\n")


def write_lms(out, results, probes, fmt, *, assignment, items=()):
    """OUT/gradebook-<fmt>.csv for an LMS (gradebook.py): each student's points after the late penalty their result
    carries, the same `final` as grades.csv's.

    items: the parts graded by hand; a student with one still pending gets no grade yet (status manual_pending)."""
    questions = question_order({p.question for p in probes})
    maximum = sum(p.points for p in probes) + sum(item.points for item in items)
    entered = manual.read_points(out, items) if items else {}
    rows, deadline = [], None
    for r in results:
        _, _, known, complete = _scored(r, questions, entered, items)
        status = r["status"] if complete or r["status"] == "grader_error" else "manual_pending"
        submitted = parse_time(r["submitted"]) if r.get("submitted") else None
        deadline = parse_time(r["deadline"]) if r.get("deadline") else deadline
        rows.append(Total(r["student"], final_points(r, known), maximum, status, submitted,
                          int(r.get("late_days") or 0), float(r.get("penalty") or 0.0)))
    return write_gradebook(pathlib.Path(out) / f"gradebook-{fmt}.csv", rows, fmt, assignment, deadline)
