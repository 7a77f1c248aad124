"""The student's own error first: what each answer cell that failed to run says, and the line of the cell it points at.

A syntax error in 3.3's cell leaves `average_gradients` undefined, and 3.3's hidden tests then fail with a rank's
`NameError`; the student must read the `SyntaxError` first. `failures(graded, cells, secrets)` reads, from the executed
notebook and execute.py's log of its cells, one row per answer cell that did not run to its end:

    {"questions": ["3.3"], "status": "error", "error": "SyntaxError: expected ':'", "line": 2,
     "text": "def average_gradients(model, world_size)", "quoted": True}

`error` is the exception's class and message as the kernel showed them (the student's text: quoted = True, shown capped
as inline code by feedback.py) or the grader's own reason (a killed kernel). `line` is the line of this cell the
traceback names last (the deepest frame in it), `text` that line of the student's source: the cell's own line even
when the error was raised in a function of an earlier cell. An error message goes through redact.Secrets.quoted: a
later answer cell can read a probe cell's source in the kernel's history (`In`) and raise it, its SETUP, nonce and
secret seed with it (then it is not shown: `GRADER_CODE`), and a cell run after a hidden test may raise numbers of
its inputs (masked).
"""
import re

from helpers.grading.judge.redact import REACHES, WITHHELD, Secrets
from helpers.grading.probes.shortcuts import as_scanned, refusal
from helpers.grading.run.probe_runtime import MESSAGE_CHARS

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_FRAME = re.compile(r"Cell In\[(\d+)\], line (\d+)")
_FILE_SUFFIX = re.compile(r" \([^()]*\.py, line \d+\)$")  # IPython's SyntaxError message: "... (4231927158.py, line 1)"
LINE_CHARS = 120
GRADER_CODE = WITHHELD
_STOPPED = {"timeout": "ran past its time limit and was stopped",
            "dead_kernel": "killed its kernel (or the kernel died)"}


def failures(graded, cells, secrets=None):
    """[row] for each answer cell whose status in `cells` (execute.py's log) is not ok, in the notebook's order.

    secrets: what no quoted message may hold (redact.Secrets; default: the graded notebook's probe and fill cells)."""
    secrets = secrets or Secrets.of_notebook(graded)
    kinds = [cell.get("metadata", {}).get("dp_course_kind") for cell in graded.cells]
    first_probe = kinds.index("probe") if "probe" in kinds else len(kinds)
    ran, scanned = "", {}  # {index: the answer cells' source up to that cell, as the scan reads it}
    for index, (cell, kind) in enumerate(zip(graded.cells, kinds)):
        if kind == "answer":
            ran += as_scanned(cell.source) + "\n"
            scanned[index] = ran
    rows = []
    for log in cells:
        index, status = log.get("index"), log.get("status")
        if log.get("kind") != "answer" or status in ("ok", None) or not 0 <= index < len(graded.cells):
            continue
        cell = graded.cells[index]
        row = {"questions": list(cell.get("metadata", {}).get("dp_course", {}).get("answers", [])),
               "status": status, "error": None, "quoted": False, "line": None, "text": None}
        error = next((o for o in cell.get("outputs", []) if o.get("output_type") == "error"), None)
        reached = refusal(scanned.get(index, ""), ()) if index > first_probe else ""
        if error is not None and status == "error" and reached:  # after a hidden test, answers that read In, frames
            row["error"] = f"{REACHES} ({reached.split(',')[0]})"
        elif error is not None and status == "error":
            row.update(error=secrets.quoted(_message(error), hidden_inputs=index > first_probe), quoted=True)
            if row["error"] == GRADER_CODE:
                row["quoted"] = False
        elif status == "error":  # killed by the grader (a fork bomb, files on its disk): its note says why
            row["error"] = _grader_note(cell) or "it was stopped by the grader"
        elif status in _STOPPED:
            row["error"] = _STOPPED[status]
        if error is not None:
            row["line"] = _line(error, cell.get("execution_count"))
        source = cell.source.split("\n")
        if row["line"] is not None and 1 <= row["line"] <= len(source):
            row["text"] = " ".join(source[row["line"] - 1].split())[:LINE_CHARS]  # the student's own line
        else:
            row["line"] = None
        rows.append(row)
    return rows


def _message(error):
    """'Class: message', capped."""
    name = " ".join(str(error.get("ename", "")).split())
    value = _FILE_SUFFIX.sub("", " ".join(_ANSI.sub("", str(error.get("evalue", ""))).split()))
    return (f"{name}: {value}" if value else name)[:MESSAGE_CHARS]


def _line(error, count):
    """The line of the cell run as In[count] that the traceback names last, or None."""
    if not isinstance(count, int):
        return None
    found = None
    for entry in error.get("traceback", []):
        for number, line in _FRAME.findall(_ANSI.sub("", str(entry))):
            if int(number) == count:
                found = int(line)
    return found


def _grader_note(cell):
    for output in cell.get("outputs", []):
        text = str(output.get("text", "")) if output.get("output_type") == "stream" else ""
        for line in text.splitlines():
            if line.startswith("[grader] "):
                return line.removeprefix("[grader] ").split(";")[0]
    return None
