"""Per-student feedback: each hidden test's name and outcome, never its source or expected value."""

_STATUS = {
    "ok": "every cell ran",
    "error": "one of your answer cells raised an error (see below)",
    "timeout": "a cell ran past its time limit and was interrupted",
    "dead_kernel": "the kernel died (os._exit, a crash, or too much memory?)",
    "missing": "none of this lab's answer cells were found: did you submit the right notebook?",
}


def feedback_markdown(result, questions):
    """Markdown feedback for one graded result."""
    total = sum(e for marks in result["marks"].values() for _, e, _ in marks)
    maximum = sum(p.points for marks in result["marks"].values() for p, _, _ in marks)
    lines = [f"# Feedback for {result['student']}", "",
             f"Score: {total:g} / {maximum:g}. Status: {result['status']} ({_STATUS[result['status']]}).", ""]
    if result.get("error"):
        lines += [result["error"], ""]
    for question in questions:
        marks = result["marks"].get(question, [])
        earned = sum(e for _, e, _ in marks)
        lines.append(f"## Question {question}: {earned:g} / {sum(p.points for p, _, _ in marks):g}")
        if question in result.get("missing", []):
            lines.append("- your answer cell for this question was not found; the released lab's cell was used")
        for probe, got, message in marks:
            mark = "passed" if got == probe.points else f"failed: {message}"
            lines.append(f"- {probe.name}: {mark}")
        lines.append("")
    return "\n".join(lines)
