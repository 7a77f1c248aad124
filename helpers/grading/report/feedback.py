"""Per-student feedback: each hidden test's name and outcome, never its source or expected value.

Text the student chose (their file name, an exception's class name and message, the reason their notebook could
not be read, a line of their cell) is shown capped, on one line and as inline code: it cannot start a heading, a list
item or HTML (`## Question 1.2: 2 / 2` or `<img onerror=...>` raised in an exception once forged lines of the
feedback).

The student's own error comes first: an answer cell that failed to run (helpers/grading/judge/answer_errors.py) is
quoted,
with its line, in the status line and as the first item of each question it answers, ahead of the hidden tests that
failed because of it.
"""
import math
import re

from helpers.grading.judge.answer_errors import LINE_CHARS
from helpers.grading.judge.redact import guarded
from helpers.grading.report.gradebook import parse_time
from helpers.grading.run.probe_runtime import MESSAGE_CHARS

_STATUS = {
    "ok": "every cell ran",
    "error": "one of your answer cells raised an error (see below)",
    "timeout": "a cell ran past its time limit and was stopped",
    "dead_kernel": "the kernel died (os._exit, a crash, or too much memory?)",
    "memory_limit": "your notebook passed the grader's memory limit (its kernel and ranks, or its outputs), and what "
                    "passed it was stopped",
    "missing": "none of this lab's answer cells were found: did you submit the right notebook?",
    "grader_error": "grading this notebook failed (see below); your instructor has the log",
}


def code(text, limit=MESSAGE_CHARS):
    """text as one Markdown code span: whitespace runs made one space, capped at limit characters, fenced by more
    backticks than it holds in a row (CommonMark), so that nothing in it is read as Markdown or HTML."""
    text = " ".join(str(text).split())
    text = text if len(text) <= limit else text[:limit] + "..."
    fence = "`" * (max((len(run) for run in re.findall(r"`+", text)), default=0) + 1)
    pad = " " if text.startswith("`") or text.endswith("`") or len(fence) > 1 else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def _message(mark):
    """A failed probe's reason: the student's text as code; the grader's own (older results: any) on one line."""
    if mark.get("quoted"):
        return code(mark["message"])
    text = " ".join(str(mark["message"]).split())[:MESSAGE_CHARS]
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _cell_error(row):
    """'raised `SyntaxError: ...` at line 2: `def f(x`' for one answer cell that failed (answer_errors.py)."""
    reason = _message({"message": row.get("error") or row["status"]})
    if row["status"] == "error":
        what = f"raised {code(row['error'])}" if row.get("quoted") else f"did not run to its end ({reason})"
    else:
        what = reason
    where = f" at line {row['line']}: {code(row['text'], LINE_CHARS)}" if row.get("line") and row.get("text") else ""
    return what + where


def _status(result):
    """The status line's reason: the student's own first failing answer cell where there is one."""
    rows = [r for r in result.get("cell_errors") or [] if r["status"] == result["status"]]
    if not rows:
        return _STATUS[result["status"]]
    questions = ", ".join(rows[0]["questions"]) or "?"
    return f"your answer cell for {questions} {_cell_error(rows[0])}"


def _duration(seconds):
    """'25 min', '14 h', '14 h 30 min', '3 days 2 h': how late, as a person says it."""
    minutes = max(1, math.ceil(seconds / 60))
    days, hours, minutes = minutes // 1440, minutes % 1440 // 60, minutes % 60
    if days >= 2:
        return f"{days} days" + (f" {hours} h" if hours else "")
    hours += 24 * days
    return " ".join(part for part in (f"{hours} h" if hours else "", f"{minutes} min" if minutes else "") if part)


def _late(result, total, maximum):
    """The late policy's line (gradebook.lateness): when the work came in, the penalty, the points that count."""
    final = f"{result.get('final', total):g} / {maximum:g}"
    if result.get("time_note"):
        when = f" ({result['submitted']})" if result.get("submitted") else ""
        return f"Submission time{when}: {result['time_note']}; {final}."
    if not result.get("late_days"):
        return f"Submitted on time: {final}."
    late = _duration((parse_time(result["submitted"]) - parse_time(result["deadline"])).total_seconds())
    return f"Submitted {late} late: -{100 * result['penalty']:g} %, {final}."


def feedback_markdown(result, questions, points, by_hand=(), secrets=None):
    """Markdown feedback for one graded result; `points` = {question: maximum}; by_hand: [(Manual, points or None)].

    secrets: what no line may hold (redact.Secrets of the student's executed notebook): every text from the kernel
    passes it again here, whatever grader wrote the result."""
    result = guarded(result, secrets) if secrets is not None else result
    total = sum(m["earned"] for marks in result["marks"].values() for m in marks)
    total += sum(earned for _, earned in by_hand if earned is not None)
    maximum = sum(points.values()) + sum(item.points for item, _ in by_hand)
    pending = [item for item, earned in by_hand if earned is None]
    note = f" Not final: {', '.join(i.question for i in pending)} is graded by hand, not yet." if pending else ""
    lines = [f"# Feedback for {code(result['student'])}", "",
             f"Score: {total:g} / {maximum:g}. Status: {result['status']} ({_status(result)}).{note}", ""]
    if "penalty" in result:
        lines += [_late(result, total, maximum), ""]
    if result.get("error"):
        lines += [code(result["error"]), ""]
    if result.get("kernels", 1) > 1:
        lines += [f"Your notebook needed {result['kernels']} kernels: a cell that ignores its time limit or kills its "
                  "kernel is stopped, and the cells before it are run again in a new kernel.", ""]
    for question in questions:
        marks = result["marks"].get(question, [])
        earned = sum(m["earned"] for m in marks)
        lines.append(f"## Question {question}: {earned:g} / {points[question]:g}")
        for row in result.get("cell_errors") or []:  # the student's own error first
            if question in row["questions"]:
                lines.append(f"- your answer cell {_cell_error(row)}: fix this first, the failures below may follow "
                             "from it")
        if result.get("composition", {}).get(question):  # graded with the solution's earlier answers (reference.py)
            lines.append(f"- {result['composition'][question]}")
        if question in result.get("missing", []):
            lines.append("- your answer cell for this question was not found; the released lab's cell was used")
        outside = result.get("outside", {}).get(question)
        if outside:
            names = ", ".join(f"`{n}`" for n in outside)
            lines.append(f"- your answer uses {names}, defined in a cell of your own: only answer cells are graded, "
                         "so it was undefined here; define it inside the answer cell")
        for m in marks:
            mark = "passed" if m["earned"] == m["points"] else f"failed: {_message(m)}"
            lines.append(f"- {m['name']}: {mark}")
        lines.append("")
    for item, earned in by_hand:
        written = (result.get("manual") or {}).get(item.question)
        score = "pending" if earned is None else f"{earned:g}"
        lines += [f"## Question {item.question} (graded by hand): {score} / {item.points:g}", f"- {item.name}",
                  "- " + ("your text was received" if written else "no text of yours was found in the notebook (the "
                          "cell was missing or left as released)"), ""]
    return "\n".join(lines)
