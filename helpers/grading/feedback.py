"""Per-student feedback: each hidden test's name and outcome, never its source or expected value."""

_STATUS = {
    "ok": "every cell ran",
    "error": "one of your answer cells raised an error (see below)",
    "timeout": "a cell ran past its time limit and was stopped",
    "dead_kernel": "the kernel died (os._exit, a crash, or too much memory?)",
    "missing": "none of this lab's answer cells were found: did you submit the right notebook?",
    "grader_error": "grading this notebook failed (see below); your instructor has the log",
}


def feedback_markdown(result, questions, points, by_hand=()):
    """Markdown feedback for one graded result; `points` = {question: maximum}; by_hand: [(Manual, points or None)]."""
    total = sum(m["earned"] for marks in result["marks"].values() for m in marks)
    total += sum(earned for _, earned in by_hand if earned is not None)
    maximum = sum(points.values()) + sum(item.points for item, _ in by_hand)
    pending = [item for item, earned in by_hand if earned is None]
    note = f" Not final: {', '.join(i.question for i in pending)} is graded by hand, not yet." if pending else ""
    lines = [f"# Feedback for {result['student']}", "",
             f"Score: {total:g} / {maximum:g}. Status: {result['status']} "
             f"({_STATUS[result['status']]}).{note}", ""]
    if result.get("error"):
        lines += [result["error"], ""]
    if result.get("kernels", 1) > 1:
        lines += [f"Your notebook needed {result['kernels']} kernels: a cell that ignores its time limit or kills its "
                  "kernel is stopped, and the cells before it are run again in a new kernel.", ""]
    for question in questions:
        marks = result["marks"].get(question, [])
        earned = sum(m["earned"] for m in marks)
        lines.append(f"## Question {question}: {earned:g} / {points[question]:g}")
        if question in result.get("missing", []):
            lines.append("- your answer cell for this question was not found; the released lab's cell was used")
        outside = result.get("outside", {}).get(question)
        if outside:
            names = ", ".join(f"`{n}`" for n in outside)
            lines.append(f"- your answer uses {names}, defined in a cell of your own: only answer cells are graded, "
                         "so it was undefined here; define it inside the answer cell")
        for m in marks:
            mark = "passed" if m["earned"] == m["points"] else f"failed: {m['message']}"
            lines.append(f"- {m['name']}: {mark}")
        lines.append("")
    for item, earned in by_hand:
        written = (result.get("manual") or {}).get(item.question)
        score = "pending" if earned is None else f"{earned:g}"
        lines += [f"## Question {item.question} (graded by hand): {score} / {item.points:g}", f"- {item.name}",
                  "- " + ("your text was received" if written else "no text of yours was found in the notebook (the "
                          "cell was missing or left as released)"), ""]
    return "\n".join(lines)
