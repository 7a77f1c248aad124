"""What goes back to a student (helpers/grading/report/returns.py), on executed notebooks made here: no kernel runs.

The fixture class's own returned notebooks are checked in tests/grading/test_grade_fixture.py (a canary planted in
its private PROBES= file)."""
import json
import time

import nbformat
import pytest

from helpers.grading import probes as probe_files
from helpers.grading.prepare.assemble import assemble
from helpers.grading.report import returns
from helpers.grading.run.probe_runtime import PROBE_MIMETYPE
from tests.grading import fixture_lab as lab

pytestmark = pytest.mark.timeout(60)

CANARY = "canary-5e1f-private-setup"


def _stream(text, name="stdout"):
    return nbformat.v4.new_output("stream", name=name, text=text)


def _executed(tmp_path, add=lab.ADD, rank_sum=lab.RANK_SUM):
    """Lab 97 assembled as the grader does, with a private setup holding CANARY, and outputs as a kernel leaves
    them: the probe cells show their values, and 97.2's answer prints the kernel's history (the probe cell)."""
    lab.build(tmp_path)
    released = nbformat.read(tmp_path / "labs" / "97_fixture.ipynb", as_version=4)
    submission = nbformat.read(lab.submission(tmp_path, "s", add, rank_sum), as_version=4)
    setup, probes = probe_files.load("97", tmp_path / "probes")
    graded, _, _ = assemble(released, submission, setup + f"\n_probe_canary = {CANARY!r}", probes, 1234)
    kinds = [c.metadata["dp_course_kind"] for c in graded.cells]
    for index, cell in enumerate(graded.cells):
        if cell.cell_type != "code":
            continue
        cell.execution_count = index + 1
        if kinds[index] == "probe":
            cell.outputs = [nbformat.v4.new_output("display_data", data={PROBE_MIMETYPE: {"results": [3.0]}})]
        elif kinds[index] == "answer":
            history = "".join(c.source for c in graded.cells[:index] if c.metadata["dp_course_kind"] == "probe")
            cell.outputs = [_stream(f"answer {index} says hello\n"), _stream(history),
                            nbformat.v4.new_output("display_data", data={"text/plain": "shown",
                                                                         "application/javascript": "alert(1)"})]
    cells = [{"index": i, "kind": k, "status": "ok", "seconds": 0.1} for i, k in enumerate(kinds)
             if graded.cells[i].cell_type == "code" and k not in ("check", "after")]
    return graded, {"student": "s", "status": "ok", "kernels": 1, "cells": cells}


def test_no_probe_no_private_setup_no_value(tmp_path):
    graded, result = _executed(tmp_path)
    assert CANARY in json.dumps(graded)  # the executed notebook holds it: the test has teeth
    text = json.dumps(returns.returned(graded, result))
    for secret in (CANARY, "_probe_run", "_probe_torch", "rank_sum(3)", PROBE_MIMETYPE, "alert(1)"):
        assert secret not in text, secret


def test_answer_cells_as_graded_and_outputs_down_to_the_first_probe(tmp_path):
    graded, result = _executed(tmp_path)
    back = returns.returned(graded, result)
    answers = [c for c in back.cells if c.get("metadata", {}).get("dp_course", {}).get("answers")]
    assert [c.source for c in answers] == [lab.ADD, lab.RANK_SUM]
    first, second = answers
    assert "says hello" in first.outputs[0]["text"] and first.execution_count  # above 97.1's probe: kept
    assert [o["text"] for o in second.outputs] == ["[grader] this cell ran without error; outputs below the first "
                                                   "hidden test are not returned\n"]
    assert 'check("97.2", globals())' in [c.source for c in back.cells]  # the public checks, to run again
    assert "question 97.1's hidden tests" in back.cells[0].source and "`s`" in back.cells[0].source
    assert set(back.metadata) <= {"kernelspec", "language_info"}
    assert all(set(c.metadata) <= {"dp_course", "tags"} for c in back.cells)
    nbformat.validate(back)


def test_a_syntax_error_below_the_first_probe_is_found_from_the_source(tmp_path):
    broken = lab.RANK_SUM.replace("def one_rank():", "def one_rank()")
    graded, result = _executed(tmp_path, rank_sum=broken)
    [cell] = [c for c in returns.returned(graded, result).cells if c.source == broken]
    assert "did not compile: SyntaxError: expected ':' (line 8: def one_rank())" in cell.outputs[0]["text"]


def test_an_error_says_its_builtin_class_only(tmp_path):
    graded, result = _executed(tmp_path)
    index = max(i for i, c in enumerate(graded.cells) if c.metadata["dp_course_kind"] == "answer")
    for name, said in (("ZeroDivisionError", "raised ZeroDivisionError"),
                       ("Secret_9f2e", "raised an exception of a class of its own")):
        graded.cells[index].outputs = [nbformat.v4.new_output("error", ename=name, evalue=CANARY, traceback=[CANARY])]
        result["cells"] = [{**c, "status": "error"} if c["index"] == index else c for c in result["cells"]]
        text = json.dumps(returns.returned(graded, result))
        assert said in text and CANARY not in text and "Secret_9f2e" not in text


def test_a_cell_the_grader_stopped_says_so(tmp_path):
    graded, result = _executed(tmp_path)
    index = min(i for i, c in enumerate(graded.cells) if c.metadata["dp_course_kind"] == "answer")
    graded.cells[index].outputs = [nbformat.v4.new_output("error", ename="KeyboardInterrupt", evalue="",
                                                          traceback=[])]
    result["cells"] = [{**c, "status": "timeout"} if c["index"] == index else c for c in result["cells"]]
    [cell] = [c for c in returns.returned(graded, result).cells if c.source == lab.ADD]
    assert cell.outputs[-1]["text"] == "[grader] this cell ran past its time limit and was stopped\n"


def test_write_puts_feedback_beside_and_never_a_stale_notebook(tmp_path):
    graded, result = _executed(tmp_path)
    for sub in ("executed", "feedback"):
        (tmp_path / sub).mkdir()
    nbformat.write(graded, tmp_path / "executed" / "s.ipynb")
    (tmp_path / "feedback" / "s.md").write_text("# Feedback\n")
    returns.write_all(tmp_path, [result], "97_fixture-graded.ipynb")
    folder = tmp_path / "return" / "s"
    assert sorted(p.name for p in folder.iterdir()) == ["97_fixture-graded.ipynb", "feedback.md"]
    returns.write(tmp_path, {**result, "kernels": 0, "cells": []}, "97_fixture-graded.ipynb")  # refused this time
    assert [p.name for p in folder.iterdir()] == ["feedback.md"]
    assert returns.write(tmp_path, {**result, "student": ".."}, "x.ipynb") is None


@pytest.mark.parametrize("line", ["a?\n", "x = %pwd\n", "!ls\n", "%time 1\n"])
def test_a_cell_of_ipython_syntax_costs_a_bounded_time(line):
    # Issue 29: an answer cell of 3,000 lines of IPython syntax. IPython tokenises the whole cell again for each one
    # it rewrites, up to 500 times, then raises RuntimeError: the returns step of the whole class (the grader's own
    # process) took minutes for one such cell (200,000 characters of `a?`: over 300 CPU-s), then ended the run.
    source = "def add(a, b):\n    return a +\n" + line * 3_000
    start = time.process_time()
    said = returns.syntax_error(source)
    assert time.process_time() - start < 1.0
    assert said is None or said.startswith("SyntaxError"), said
    assert returns.syntax_error(line * 5 + "def f(:\n") .startswith("SyntaxError: invalid syntax (line 6: def f(:)")
