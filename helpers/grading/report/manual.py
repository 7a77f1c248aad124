"""Parts of a lab graded by hand (a written report): the student's text, the sheet of points, what the totals count.

A probe file declares them (`MANUAL = [Manual(question, name, points, cell)]`, helpers/grading/probes). The
grader never judges them; it hands them to the instructor and counts what the instructor enters:

1. Grading a class copies each student's text, the Markdown cell with the item's cell id in the submission (or,
   if the student recreated the cell, the one starting with the same heading; its first MAX_TEXT_CHARS characters),
   into OUT/manual/<question>/<student>.md, and lists every (student, question) in OUT/manual.csv:

       student,question,points,max,words,text
       alice,10.4,,6,212,manual/10.4/alice.md        <- points empty: pending

   A text left as the released template, or missing, is listed with words 0 and no file: nothing to read.
2. The instructor fills the `points` column (0 to max; decimals allowed) and runs the same `make grade` command
   with RESUME=1: no submission is executed again; grades.csv, the feedback and the LMS file are rewritten with
   those points. Points already entered are kept whenever the sheet is rewritten.
3. Until every item of a student has points, that student is `pending` in grades.csv's `by_hand` column, their
   `total` counts only the points known so far (out of a `max` that includes the hand-graded points), and the LMS
   file leaves their grade blank, as for a grader_error: an import changes nothing until the grade is complete.
"""
import csv
import pathlib

from helpers.grading.report.spreadsheet import original, write_csv

SHEET = "manual.csv"
_COLUMNS = ["student", "question", "points", "max", "words", "text"]


def texts(released, submission, items):
    """{question: the student's Markdown text, or None when missing or left as released}."""
    found = {}
    for item in items:
        template = next((c.source for c in released.cells if c.get("id") == item.cell), "")
        heading = template.strip().splitlines()[0] if template.strip() else None
        cells = [c for c in submission.cells if c.cell_type == "markdown"]
        mine = next((c.source for c in cells if c.get("id") == item.cell), None)
        if mine is None and heading:
            mine = next((c.source for c in cells if c.source.strip().startswith(heading)), None)
        found[item.question] = None if mine is None or mine.strip() == template.strip() else _capped(mine)
    return found


# Lab 10's report asks for two paragraphs (its released cell holds 915 characters); a text of megabytes would be
# copied whole into the student's result, manual/ and every re-run of the reports.
MAX_TEXT_CHARS = 100_000


def _capped(text):
    if len(text) <= MAX_TEXT_CHARS:
        return text
    return (f"{text[:MAX_TEXT_CHARS]}\n\n[grader] the text goes on for {len(text) - MAX_TEXT_CHARS:,} characters "
            "more, not copied here: read them in the student's notebook")


def read_points(out, items):
    """{(student, question): points} entered in OUT/manual.csv; a value outside [0, max] is refused."""
    path = pathlib.Path(out) / SHEET
    if not path.exists():
        return {}
    maximum = {item.question: item.points for item in items}
    points = {}
    with open(path, newline="", encoding="utf-8") as f:
        for line, row in enumerate(csv.DictReader(f), start=2):
            text = (row.get("points") or "").strip()
            if not text or row.get("question") not in maximum:
                continue
            try:
                value = float(text)
            except ValueError:
                value = -1.0
            top = maximum[row["question"]]
            if not 0 <= value <= top:
                raise ValueError(f"{path}:{line}: points={text!r} for {row['student']}, {row['question']}; enter a "
                                 f"number from 0 to {top:g}, or leave it empty while the item is not graded")
            points[(original(row["student"]), row["question"])] = value  # the id as written, quoted or not
    return points


def write_sheet(out, items, results):
    """OUT/manual.csv and OUT/manual/<question>/<student>.md, keeping the points already entered; returns them."""
    out = pathlib.Path(out)
    points = read_points(out, items)
    rows = []
    for result in results:
        for item in items:
            text = (result.get("manual") or {}).get(item.question)
            relative = ""
            if text:
                relative = f"manual/{item.question}/{result['student']}.md"
                (out / relative).parent.mkdir(parents=True, exist_ok=True)
                (out / relative).write_text(text + "\n", encoding="utf-8", errors="replace")
            entered = points.get((result["student"], item.question))
            rows.append([result["student"], item.question, "" if entered is None else f"{entered:g}",
                         f"{item.points:g}", len(text.split()) if text else 0, relative])
    write_csv(out / SHEET, [_COLUMNS, *rows], lineterminator="\n")
    return points


def earned(points, student, items):
    """({question: points or None}, complete): the hand-graded points of one student, and whether all are in."""
    marks = {item.question: points.get((student, item.question)) for item in items}
    return marks, all(value is not None for value in marks.values())
