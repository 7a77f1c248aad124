"""A student id that a spreadsheet would run as a formula is written as text in every CSV the grader writes.

The id is the submission's file name: `=HYPERLINK("http:∕∕evil.example","open").ipynb` (a Unicode slash) was the
first cell of its row in grades.csv and the LMS file, a live link when the instructor opened them (OWASP, "CSV
Injection": https://owasp.org/www-community/attacks/CSV_Injection)."""
import csv

import pytest

from helpers.grading.probes import Manual, Probe
from helpers.grading.report import gradebook, manual, spreadsheet
from helpers.grading.report.report import write_outputs
from helpers.grading.report.similarity import Answer, Pair
from helpers.grading.report.similarity_report import _write_csv as write_similarity_csv

EVIL = '=HYPERLINK("http:∕∕evil.example","open")'
HOSTILE_IDS = [EVIL, "+cmd|' -C calc'!A0", "-2+3", "@SUM(A1)", "\tx", "\rx"]
PROBES = [Probe("10.1", "a", "x", points=3)]
ITEMS = [Manual("10.4", "the report", points=6, cell="report")]


def _result(student):
    return {"student": student, "status": "ok", "seconds": 1.0, "missing": [], "manual": {"10.4": "text"},
            "marks": {"10.1": [{"name": "a", "points": 3, "earned": 3, "message": ""}]},
            "cells": [{"index": 0, "kind": "answer", "status": "ok", "seconds": 0.5}]}


def _cells(path):
    with open(path, newline="", encoding="utf-8") as f:
        return [cell for row in list(csv.reader(f))[1:] for cell in row]


def _safe(cells):
    return [c for c in cells if isinstance(c, str) and c[:1] in ("=", "+", "-", "@", "\t", "\r")]


@pytest.mark.parametrize("student", HOSTILE_IDS)
def test_every_csv_the_grader_writes_starts_no_cell_with_a_formula(tmp_path, student):
    (tmp_path / "feedback").mkdir()
    write_outputs(tmp_path, PROBES, [_result(student), _result("alice")], ITEMS)
    answer = Answer(student, "10.1", "", ("V",) * 20, (1,) * 20)
    write_similarity_csv(tmp_path / "similarity.csv", [Pair("10.1", answer, answer, frozenset(), frozenset(), 1)])
    written = {name: _cells(tmp_path / name) for name in ("grades.csv", "cells.csv", "manual.csv", "similarity.csv")}
    for fmt in gradebook.FORMATS:
        path = gradebook.write_gradebook(tmp_path / f"{fmt}.csv", [gradebook.Total(student, 3, 9)], fmt, "Lab 10")
        written[path.name] = _cells(path)
    for name, cells in written.items():
        assert not _safe(cells), (name, _safe(cells))
        assert "'" + student in cells, (name, cells)


def test_points_entered_for_an_escaped_id_are_read_back(tmp_path):
    # manual.csv is read again: the quote the grader added (or a spreadsheet saving it as text) is not the id.
    (tmp_path / "feedback").mkdir()
    write_outputs(tmp_path, PROBES, [_result(EVIL)], ITEMS)
    sheet = tmp_path / manual.SHEET
    rows = list(csv.reader(open(sheet, newline="", encoding="utf-8")))
    assert rows[1][:2] == ["'" + EVIL, "10.4"]
    rows[1][2] = "5"
    with open(sheet, "w", newline="", encoding="utf-8") as f:
        csv.writer(f).writerows(rows)
    assert manual.read_points(tmp_path, ITEMS) == {(EVIL, "10.4"): 5.0}


def test_numbers_and_plain_text_are_written_as_they_were():
    row = ["alice", "3", "-1", "-0.5", "2.5e-3", 7, 1.5, "", "ok", "Lab 10", "it's"]
    assert spreadsheet.safe_row(row) == row
    assert spreadsheet.safe_cell("-1+1") == "'-1+1" and spreadsheet.safe_cell("-") == "'-"
    assert spreadsheet.original("'" + EVIL) == EVIL and spreadsheet.original("'quoted") == "'quoted"
