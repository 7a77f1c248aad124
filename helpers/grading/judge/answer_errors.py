"""The student's own error first: what each answer cell that failed to run says, and the line of the cell it points at.

A syntax error in 3.3's cell leaves `average_gradients` undefined, and 3.3's hidden tests then fail with a rank's
`NameError`; the student must read the `SyntaxError` first. `failures(graded, cells, secrets)` reads, from the executed
notebook and execute.py's log of its cells, one row per answer cell that did not run to its end:

    {"questions": ["3.3"], "status": "error", "error": "SyntaxError: expected ':'", "line": 2,
     "text": "def average_gradients(model, world_size)", "quoted": True}

`error` is the exception's class and message as the kernel showed them (the student's text: quoted = True, shown capped
as inline code by feedback.py) or the grader's own reason (a killed kernel). `line` is the line of this cell the
traceback names last (the deepest frame in it), `text` that line of the student's source: the cell's own line even
when the error was raised in a function of an earlier cell. An error message that holds the grader's code is not
shown: a later answer cell can read a probe cell's source in the kernel's history (`In`) and raise it, its SETUP,
nonce and secret seed with it (`GRADER_CODE`).
"""
import re

from helpers.grading.run.probe_runtime import MESSAGE_CHARS

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_FRAME = re.compile(r"Cell In\[(\d+)\], line (\d+)")
_FILE_SUFFIX = re.compile(r" \([^()]*\.py, line \d+\)$")  # IPython's SyntaxError message: "... (4231927158.py, line 1)"
LINE_CHARS = 120
WINDOW = 16  # a message sharing this many characters in a row with the grader's code is not shown
GRADER_CODE = "the message quoted the grader's code, so it is not shown"
_STOPPED = {"timeout": "ran past its time limit and was stopped",
            "dead_kernel": "killed its kernel (or the kernel died)"}


def failures(graded, cells, secrets=()):
    """[row] for each answer cell whose status in `cells` (execute.py's log) is not ok, in the notebook's order.

    secrets: texts no quoted message may hold besides the probe cells' own sources (the SETUP, the references)."""
    secret = _secret_texts(graded, secrets)
    rows = []
    for log in cells:
        index, status = log.get("index"), log.get("status")
        if log.get("kind") != "answer" or status in ("ok", None) or not 0 <= index < len(graded.cells):
            continue
        cell = graded.cells[index]
        row = {"questions": list(cell.get("metadata", {}).get("dp_course", {}).get("answers", [])),
               "status": status, "error": None, "quoted": False, "line": None, "text": None}
        error = next((o for o in cell.get("outputs", []) if o.get("output_type") == "error"), None)
        if error is not None and status == "error":
            row.update(error=_message(error, secret), quoted=True)
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
            row["text"] = " ".join(source[row["line"] - 1].split())[:LINE_CHARS]
        else:
            row["line"] = None
        rows.append(row)
    return rows


def _message(error, secret):
    """'Class: message', capped; GRADER_CODE if it holds a piece of the grader's code."""
    name = " ".join(str(error.get("ename", "")).split())
    value = _FILE_SUFFIX.sub("", " ".join(_ANSI.sub("", str(error.get("evalue", ""))).split()))
    text = (f"{name}: {value}" if value else name)[:MESSAGE_CHARS]
    return GRADER_CODE if holds_grader_code(text, secret) else text


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


def _secret_texts(graded, secrets):
    """The probe cells' sources and the other secrets, whitespace runs made one space."""
    texts = [cell.source for cell in graded.cells if cell.get("metadata", {}).get("dp_course_kind") == "probe"]
    return [" ".join(str(t).split()) for t in (*texts, *secrets) if t]


def holds_grader_code(message, secret):
    """Whether message shares WINDOW characters in a row with a text of secret (whitespace runs made one space), or
    holds a long number or hexadecimal run of one (a probe cell's seed, its nonce)."""
    text = " ".join(str(message).split())
    for hidden in secret:
        if any(text[i:i + WINDOW] in hidden for i in range(max(0, len(text) - WINDOW + 1))):
            return True
        if any(token in text for token in re.findall(r"\d{6,}|[0-9a-f]{8,}", hidden)):
            return True
    return False
