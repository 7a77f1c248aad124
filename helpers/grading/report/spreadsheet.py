"""Every CSV the grader writes (grades.csv, cells.csv, manual.csv, similarity.csv, the LMS files), safe to open in a
spreadsheet.

A student id is a submission's file name, the student's choice: `=HYPERLINK("http:∕∕evil.example","open").ipynb`
(a Unicode slash) was the first cell of its row, which Excel, LibreOffice and Google Sheets run as a formula. As
OWASP advises (https://owasp.org/www-community/attacks/CSV_Injection), a text cell starting with = + - @, a tab or a
carriage return gets a leading single quote: spreadsheets show it as text. Numbers (ints, floats, and strings that
are one, such as "-1") are written as they are; every number the grader writes is >= 0 anyway. `original` undoes
the quote for the one CSV the grader reads back (manual.csv).
"""
import csv
import io
import re

_FORMULA_START = ("=", "+", "-", "@", "\t", "\r")
_NUMBER = re.compile(r"-?\d+(\.\d+)?([eE][-+]?\d+)?")


def safe_cell(value):
    """value, or "'" + value when it is text a spreadsheet would read as a formula."""
    if isinstance(value, str) and value.startswith(_FORMULA_START) and not _NUMBER.fullmatch(value):
        return "'" + value
    return value


def safe_row(row):
    return [safe_cell(value) for value in row]


def original(text):
    """A cell as the grader meant it: without the quote safe_cell added (a spreadsheet may keep it or drop it)."""
    return text[1:] if text.startswith("'") and text[1:].startswith(_FORMULA_START) else text


def write_csv(path, rows, lineterminator="\r\n"):
    """Write rows (the header first) to path, UTF-8, every cell through safe_cell; returns path."""
    with open(path, "w", newline="", encoding="utf-8", errors="replace") as f:  # half a surrogate pair: "?"
        for row in rows:
            # Formatted with "\r\n" and then given the file's ending: Python 3.11's writer quotes a cell only for
            # the characters of its own line ending, so with "\n" an id holding "\r" split its row in two.
            line = io.StringIO()
            csv.writer(line, lineterminator="\r\n").writerow(safe_row(row))
            f.write(line.getvalue()[:-2] + lineterminator)
    return path
