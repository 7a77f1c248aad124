"""Parts graded by hand (helpers/grading/report/manual.py): the text found, the sheet kept, the totals and the LMS
file."""
import csv

import nbformat
import pytest

from helpers.grading.probes import Manual, Probe
from helpers.grading.report import manual
from helpers.grading.report.report import write_lms, write_outputs

ITEMS = [Manual("10.4", "the report's analysis", points=6, cell="report-analysis")]
PROBES = [Probe("10.1", "a", "x", points=3), Probe("10.2", "b", "x", points=4)]
TEMPLATE = "### 10.4 Your analysis (graded by hand)\n\n*Replace this text with two paragraphs.*"


def _notebook(text, cell_id="report-analysis"):
    cell = nbformat.v4.new_markdown_cell(text)
    cell.id = cell_id
    return nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell("# Lab 10"), cell])


def _result(student, earned=(3, 4), text="My two paragraphs."):
    return {"student": student, "status": "ok", "seconds": 1.0, "cells": [], "missing": [],
            "marks": {"10.1": [{"name": "a", "points": 3, "earned": earned[0], "message": ""}],
                      "10.2": [{"name": "b", "points": 4, "earned": earned[1], "message": ""}]},
            "manual": {"10.4": text}}


def _out(tmp_path):
    (tmp_path / "feedback").mkdir()
    return tmp_path


def _grades(out):
    with open(out / "grades.csv") as f:
        return {row["student"]: row for row in csv.DictReader(f)}


def _scores(lms):
    """{student: score} of a Canvas file (the id is in "SIS User ID")."""
    with open(lms) as f:
        return {row[2]: row[-1] for row in list(csv.reader(f))[1:]}


def _enter(out, student, points):
    with open(out / "manual.csv") as f:
        rows = list(csv.DictReader(f))
    for row in rows:
        if row["student"] == student:
            row["points"] = points
    with open(out / "manual.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def test_the_text_is_found_by_cell_id_then_by_heading_and_a_template_is_no_text():
    released = _notebook(TEMPLATE)
    assert manual.texts(released, _notebook(TEMPLATE + "\nmine"), ITEMS) == {"10.4": TEMPLATE + "\nmine"}
    recreated = _notebook(TEMPLATE.splitlines()[0] + "\nwritten in a new cell", cell_id="other")
    assert manual.texts(released, recreated, ITEMS)["10.4"].endswith("written in a new cell")
    assert manual.texts(released, _notebook(TEMPLATE), ITEMS) == {"10.4": None}      # left as released
    assert manual.texts(released, _notebook("# something else", "x"), ITEMS) == {"10.4": None}


def test_pending_then_graded_in_grades_csv_feedback_and_the_lms_file(tmp_path):
    out = _out(tmp_path)
    results = [_result("ada"), _result("bob", text=None)]
    write_outputs(out, PROBES, results, ITEMS)
    rows = _grades(out)
    assert rows["ada"]["10.4 (by hand)"] == "" and rows["ada"]["by_hand"] == "pending"
    assert (rows["ada"]["total"], rows["ada"]["max"]) == ("7", "13")      # the points known, of all of them
    assert (out / "manual" / "10.4" / "ada.md").read_text() == "My two paragraphs.\n"
    assert not (out / "manual" / "10.4" / "bob.md").exists()
    feedback = (out / "feedback" / "ada.md").read_text()
    assert "Score: 7 / 13" in feedback and "Not final" in feedback and "(graded by hand): pending / 6" in feedback
    assert "no text of yours" in (out / "feedback" / "bob.md").read_text()
    lms = write_lms(out, results, PROBES, "canvas", assignment="Lab 10", items=ITEMS)
    assert _scores(lms) == {"ada": "", "bob": ""}                    # no grade uploaded while pending

    _enter(out, "ada", "4.5")
    write_outputs(out, PROBES, results, ITEMS)
    rows = _grades(out)
    assert (rows["ada"]["10.4 (by hand)"], rows["ada"]["total"], rows["ada"]["by_hand"]) == ("4.5", "11.5", "graded")
    assert rows["bob"]["by_hand"] == "pending"
    assert "(graded by hand): 4.5 / 6" in (out / "feedback" / "ada.md").read_text()
    lms = write_lms(out, results, PROBES, "canvas", assignment="Lab 10", items=ITEMS)
    assert _scores(lms) == {"ada": "11.5", "bob": ""}
    write_outputs(out, PROBES, results, ITEMS)                        # a rewrite keeps what was entered
    assert _grades(out)["ada"]["10.4 (by hand)"] == "4.5"


@pytest.mark.parametrize("points", ["7", "-1", "lots"])
def test_points_outside_the_scale_are_refused_with_the_row(tmp_path, points):
    out = _out(tmp_path)
    write_outputs(out, PROBES, [_result("ada")], ITEMS)
    _enter(out, "ada", points)
    with pytest.raises(ValueError, match=r"manual.csv:2: points=.* for ada, 10.4; enter a number from 0 to 6"):
        manual.read_points(out, ITEMS)


def test_a_lab_without_parts_graded_by_hand_keeps_its_columns(tmp_path):
    out = _out(tmp_path)
    write_outputs(out, PROBES, [_result("ada")])
    with open(out / "grades.csv") as f:
        assert next(csv.reader(f)) == ["student", "10.1", "10.2", "total", "max", "status", "seconds"]
    assert not (out / "manual.csv").exists()
