"""What goes back to a student: OUT/return/<student>/, their notebook as graded and their feedback.

OUT/executed/<student>.ipynb is the instructor's: it holds every probe cell (the hidden tests' expressions, the setup
of a private PROBES= file, the question's secret seed, the solution's earlier answers a probe binds) and the values
they displayed. The returned notebook is built from it by allow-list, never by removing what is known to be secret:

| in the executed notebook | returned |
|---|---|
| a cell the grader marked lab, check, after (the released lab's) or answer (the student's) | its source |
| any other cell: a probe cell, a cell without the grader's mark | nothing |
| outputs of a cell above the first probe cell | stream, error and the MIMES below: no hidden test had run yet (one |
|                                                | holding a piece of a probe cell or a seed anyway: a line of the |
|                                                | grader's instead, redact.py) |
| outputs of a cell from the first probe (or fill) cell on | none: code run after a hidden test can print it (`In`) |
| ... of an answer cell there | one line of the grader's: whether it ran, its error's class if a builtin one, and |
|                               | a syntax error found by compiling the student's source here |
| cell metadata | `dp_course` (the questions a cell answers) and `tags` |
| notebook metadata | `kernelspec`, `language_info` |

Beside it, `feedback.md` is OUT/feedback/<student>.md (helpers/grading/report/feedback.py: probes named, never their
source
or expected values). A submission that was never run (unreadable, refused, a grader_error) gets its feedback only.
"""
import builtins
import json
import pathlib
import shutil
import warnings

import nbformat

from helpers.grading.judge.redact import WITHHELD, Secrets
from helpers.grading.report.feedback import code

MIMES = ("text/plain", "text/markdown", "text/html", "image/png", "image/jpeg", "image/svg+xml")
KINDS = ("lab", "answer", "check", "after")
_CELL_METADATA = ("dp_course", "tags")
_NOTEBOOK_METADATA = ("kernelspec", "language_info")
_BUILTIN_ERRORS = frozenset(n for n, v in vars(builtins).items()
                            if isinstance(v, type) and issubclass(v, BaseException))
COMPILE_CHARS = 20_000  # a longer cell is not compiled here (the longest answer of solutions/ is 6,297 characters)
IPYTHON_LINES = 5  # pieces of IPython syntax rewritten before giving up (an answer cell holds one or two)

NOTE = """**Returned by the grader** for {student}: the lab as it was graded, with your answer cells. Your score and \
every hidden test's outcome are in `feedback.md`, beside this notebook.

Outputs are shown down to question {first}'s hidden tests, the first to run. Below them, each of your answer cells \
says only whether it ran (and, for a syntax error, where): code run after a hidden test could print that test, so \
what those cells printed stays with your instructor. The public check cells were not run by the grader; run them \
yourself."""

_RAN = {"ok": "ran without error", "timeout": "ran past its time limit and was stopped",
        "dead_kernel": "killed its kernel (or the kernel died)", "skipped": "was not run: the grading time ran out"}


def write_all(out, results, name):
    """OUT/return/<student>/ for every result (a dict of results/<student>.json); name: the notebook's file name."""
    for result in results:
        try:  # one student's notebook never costs the class its returns (issue 29)
            write(out, result, name)
        except Exception as exc:  # noqa: BLE001 - said in logs/grader.log; the feedback alone goes back
            with open(pathlib.Path(out) / "logs" / "grader.log", "a", encoding="utf-8", errors="replace") as log:
                log.write(f"{result['student']}: the returned notebook could not be written ({type(exc).__name__}: "
                          f"{exc}); return/ holds the feedback alone\n")
            folder = pathlib.Path(out) / "return" / result["student"]
            feedback = pathlib.Path(out) / "feedback" / f"{result['student']}.md"
            if folder.is_dir() and feedback.exists() and not (folder / "feedback.md").exists():
                shutil.copyfile(feedback, folder / "feedback.md")


def write(out, result, name):
    """OUT/return/<student>/: feedback.md and, if the submission was run, `name` (the graded notebook)."""
    out, student = pathlib.Path(out), result["student"]
    if student in ("", ".", "..") or "/" in student:
        return None  # not a file name SUBMISSIONS can hold; never a path outside OUT/return
    folder = out / "return" / student
    if folder.exists():
        shutil.rmtree(folder)  # an earlier run's notebook must not stay beside this run's feedback
    folder.mkdir(parents=True)
    feedback = out / "feedback" / f"{student}.md"
    if feedback.exists():
        shutil.copyfile(feedback, folder / "feedback.md")
    executed = out / "executed" / f"{student}.ipynb"
    if result.get("kernels", 0) > 0 and executed.exists():
        with warnings.catch_warnings():  # nbformat's validation notes: the executed notebook is the grader's own
            warnings.simplefilter("ignore")
            graded = nbformat.read(executed, as_version=4)
        nbformat.write(returned(graded, result), folder / name)
    return folder


def returned(graded, result):
    """The notebook a student may see, from the executed one and its result (the cells' statuses)."""
    status = {c["index"]: c for c in result.get("cells", []) if not str(c.get("kind", "")).startswith("replay")}
    secrets = Secrets.of_notebook(graded, seeds=[result["probe_seed"]] if result.get("probe_seed") else [])
    kinds = [cell.metadata.get("dp_course_kind") for cell in graded.cells]
    probe = kinds.index("probe") if "probe" in kinds else len(kinds)
    question = graded.cells[probe].metadata.get("dp_course_question", "?") if probe < len(kinds) else None
    # From the first cell of the grader's code on (a fill cell holds the solution's answer: reference.py), the kernel
    # holds what a student may not see: its outputs are not returned.
    first = min([probe, *(i for i, kind in enumerate(kinds) if kind == "fill")])
    notebook = nbformat.v4.new_notebook(metadata={k: graded.metadata[k] for k in _NOTEBOOK_METADATA
                                                  if k in graded.metadata})
    notebook.cells.append(nbformat.v4.new_markdown_cell(NOTE.format(student=code(result["student"], 100),
                                                                    first=question or "-")))
    for index, cell in enumerate(graded.cells):
        kind = cell.metadata.get("dp_course_kind")
        if kind not in KINDS or cell.cell_type not in ("code", "markdown"):
            continue
        metadata = {k: json.loads(json.dumps(cell.metadata[k])) for k in _CELL_METADATA if k in cell.metadata}
        if cell.cell_type == "markdown":
            notebook.cells.append(nbformat.v4.new_markdown_cell(cell.source, metadata=metadata))
            continue
        copy = nbformat.v4.new_code_cell(cell.source, metadata=metadata)
        if index < first:
            copy.outputs = [_unless_secret(kept, secrets) for kept in map(_output, cell.get("outputs", []))
                            if kept is not None]
            copy.execution_count = cell.get("execution_count") if copy.outputs else None
            ran = status.get(index)
            if kind == "answer" and ran and ran["status"] in _RAN and ran["status"] != "ok":  # the grader stopped it
                copy.outputs.append(nbformat.v4.new_output("stream", name="stderr",
                                                           text=f"[grader] this cell {_RAN[ran['status']]}\n"))
        elif kind == "answer":
            copy.outputs = [_status_line(cell, status.get(index))]
        notebook.cells.append(copy)
    return notebook


def _output(output):
    """An output of a cell above the first probe, rebuilt from the allowed fields only; None if none is allowed."""
    kind = output.get("output_type")
    if kind == "stream":
        return nbformat.v4.new_output("stream", name="stderr" if output.get("name") == "stderr" else "stdout",
                                      text=str(output.get("text", "")))
    if kind == "error":
        return nbformat.v4.new_output("error", ename=str(output.get("ename", "")),
                                      evalue=str(output.get("evalue", "")),
                                      traceback=[str(line) for line in output.get("traceback", [])])
    if kind in ("execute_result", "display_data"):
        data = {m: v for m, v in output.get("data", {}).items() if m in MIMES}
        if not data:
            return None
        more = {"execution_count": output.get("execution_count")} if kind == "execute_result" else {}
        return nbformat.v4.new_output(kind, data=data, **more)
    return None


def _unless_secret(output, secrets):
    """output, or the grader's line saying it is not returned if its text holds a secret (redact.Secrets.guard)."""
    texts = [output.get("text", ""), output.get("ename", ""), output.get("evalue", ""), *output.get("traceback", []),
             *(v for m, v in output.get("data", {}).items() if not m.startswith("image/") or m == "image/svg+xml")]
    if all(secrets.guard(str(t)) != WITHHELD for t in texts):
        return output
    return nbformat.v4.new_output("stream", name="stderr", text="[grader] an output holding the grader's hidden code "
                                  "or a seed is not returned\n")


def _status_line(cell, ran):
    """The grader's one line on an answer cell run after a hidden test: its status, never what it printed."""
    syntax = syntax_error(cell.source)
    if syntax:
        text = f"this cell did not compile: {syntax}"
    elif ran is None:
        text = "this cell was not run (an earlier cell stopped the grading of this notebook)"
    elif ran["status"] == "error":
        errors = [o for o in cell.get("outputs", []) if o.get("output_type") == "error"]
        name = errors[0].get("ename") if errors else None
        what = f"raised {name}" if name in _BUILTIN_ERRORS else "raised an exception of a class of its own"
        text = f"this cell {what}; the message is in your feedback"
    else:
        text = f"this cell {_RAN.get(ran['status'], ran['status'])}"
    return nbformat.v4.new_output("stream", name="stderr", text=f"[grader] {text}; outputs below the first hidden "
                                  "test are not returned\n")


def syntax_error(source):
    """'SyntaxError: ... (line N: the line)' if source, as IPython would run it, does not compile; else None.

    Found here from the student's own source, so it says nothing the kernel printed. IPython tokenises a whole cell
    again for each piece of its syntax it rewrites (`a?`, `x = %pwd`, `!ls`), up to 500 times, then raises: a cell of
    3,000 such lines took minutes of the grader's own process, for the whole class (test_returns). Past IPYTHON_LINES
    rewrites, or COMPILE_CHARS characters, it is not compiled: the status line says the rest."""
    if len(source) > COMPILE_CHARS:
        return None
    from IPython.core.inputtransformer2 import TransformerManager

    try:
        manager = TransformerManager()
        lines = (source if source.endswith("\n") else source + "\n").splitlines(keepends=True)
        for transform in manager.cleanup_transforms + manager.line_transforms:  # one pass each (transform_cell's)
            lines = transform(lines)
        for _ in range(IPYTHON_LINES + 1):
            changed, lines = manager.do_one_token_transform(lines)
            if not changed:
                break
        else:
            return None
        compile("".join(lines), "<cell>", "exec", dont_inherit=True)
    except SyntaxError as exc:  # IndentationError too
        lines = source.split("\n")
        where = lines[exc.lineno - 1].strip() if exc.lineno and exc.lineno <= len(lines) else ""
        return f"{type(exc).__name__}: {exc.msg} (line {exc.lineno}: {where[:120]})"
    except Exception:  # noqa: BLE001 - cannot tell (a null byte, thousands of nested brackets, IPython giving up)
        return None
    return None
    from IPython.core.inputtransformer2 import TransformerManager

    try:
        python = TransformerManager().transform_cell(source)
        compile(python, "<cell>", "exec", dont_inherit=True)
    except SyntaxError as exc:  # IndentationError too
        lines = source.split("\n")
        where = lines[exc.lineno - 1].strip() if exc.lineno and exc.lineno <= len(lines) else ""
        return f"{type(exc).__name__}: {exc.msg} (line {exc.lineno}: {where[:120]})"
    except (ValueError, RecursionError, MemoryError, OverflowError):
        return None  # cannot tell (a null byte, thousands of nested brackets): the status line says the rest
    return None
