"""What a student is never shown (helpers/grading/judge/redact.py): a piece of a probe cell, a seed or nonce, a number
of a hidden test's inputs. Unit tests on texts; the fixture class (test_grade_fixture.py) attacks it in a kernel."""
import nbformat

from helpers.grading.judge.redact import MASK, WITHHELD, Secrets, mask_numbers
from helpers.grading.report.feedback import feedback_markdown
from helpers.grading.report.returns import returned

SETUP = "_probe_canary = 'canary-private-setup-3b9d'\nimport torch as _probe_torch\n"
PROBE = ("from helpers.grading.run.probe_runtime import run_probes as _probe_run\n"
         f"_probe_run('97.1', {SETUP!r}, [('adds', 'add(_probe_torch.ones(4))')], '8605e895d0057980', 1916947015)\n")
ANSWER = "import torch\n\ndef add(a, b):\n    return a + b\n"


def _notebook(answer=ANSWER, outputs=()):
    cells = [nbformat.v4.new_code_cell(answer, outputs=[nbformat.from_dict(o) for o in outputs]),
             nbformat.v4.new_code_cell(PROBE)]
    for cell, kind in zip(cells, ("answer", "probe")):
        cell.metadata["dp_course_kind"] = kind
    cells[0].metadata["dp_course"] = {"answers": ["97.1"]}
    return nbformat.v4.new_notebook(cells=cells)


SECRETS = Secrets.of_notebook(_notebook(), seeds=(1234567,))


def test_numbers_an_answer_saw_on_hidden_inputs_are_masked():
    said = "ValueError: (tensor([ 48611, 0.3142, 1e-05]), tensor([5, 7])) float64 line 3"
    assert mask_numbers(said) == f"ValueError: (tensor([ {MASK}, {MASK}, {MASK}]), tensor([5, 7])) float64 line 3"
    assert SECRETS.quoted(said) == mask_numbers(said)
    assert SECRETS.quoted(said, hidden_inputs=False) == said, "before any hidden test, the student's own numbers"


def test_a_piece_of_the_probe_cell_is_withheld_however_it_is_cut_or_escaped():
    for leaked in (PROBE[:120], repr(repr(SETUP)), " ".join(PROBE[i:i + 15] for i in range(0, 300, 15)),
                   "x canary-priva te-setup-3b9d", SETUP.upper()):
        assert SECRETS.quoted(leaked) == WITHHELD, leaked
    honest = ("NameError: name 'add' is not defined", "RuntimeError: The size of tensor a (4) must match the size of "
              "tensor b (5) at non-singleton dimension 0", "TypeError: add() takes 2 positional arguments but 3 were "
              "given", "ImportError: import torch failed")
    assert [SECRETS.quoted(h, hidden_inputs=False) for h in honest] == list(honest)


def test_what_the_students_own_cells_hold_is_not_secret():
    # A student who wrote the probe's wrapper line into an answer may see it quoted back: it is theirs.
    own = Secrets.of_notebook(_notebook(ANSWER + "# from helpers.grading.run.probe_runtime import run_probes\n"))
    assert own.quoted("from helpers.grading.run.probe_runtime import run_probes", hidden_inputs=False) != WITHHELD
    assert own.quoted(repr(SETUP)) == WITHHELD


def test_a_seed_or_nonce_is_withheld_even_split_and_in_the_graders_own_lines():
    for leaked in ("seed 19 169 47015", "n 8605e895 d0057980", "wrong shape (1234567,)", "1_916_947_015"):
        assert SECRETS.quoted(leaked) == WITHHELD and SECRETS.said(leaked) == WITHHELD, leaked
    assert SECRETS.said("wrong shape (48611,)") == "wrong shape (48611,)", "the grader's line keeps its numbers"
    code = Secrets(code=["def average_gradients(model, world_size):\n    flat = torch.cat(grads) / world_size\n"])
    assert code.said("expected flat = torch.cat(grads) / world_size") == WITHHELD, "a reference's line"


def test_a_result_written_before_is_guarded_when_its_feedback_is_written():
    # A result kept by RESUME=1 from a grader without redaction: the feedback still quotes none of it.
    marks = {"97.1": [{"name": "adds", "points": 1, "earned": 0.0, "quoted": True,
                       "message": "RuntimeError: " + PROBE[70:300]},
                      {"name": "adds more", "points": 1, "earned": 0.0, "message": "wrong shape (1916947015,)"}]}
    rows = [{"questions": ["97.1"], "status": "error", "error": "ValueError: seed=1916947015", "quoted": True,
             "line": 1, "text": "raise ValueError(In[-1])"}]
    result = {"student": "ada", "status": "error", "marks": marks, "cell_errors": rows}
    text = feedback_markdown(result, ["97.1"], {"97.1": 2}, secrets=SECRETS)
    assert "canary" not in text and "1916947015" not in text and text.count(WITHHELD) == 4, text
    assert "raise ValueError(In[-1])" in text, "the student's own line"


def test_an_output_returned_holds_no_secret():
    # Above the first hidden test nothing secret is in the kernel; an output holding it anyway is not returned.
    printed = {"output_type": "stream", "name": "stdout", "text": f"seed {1916947015} {SETUP}"}
    fine = {"output_type": "stream", "name": "stdout", "text": "hello\n"}
    graded = _notebook(outputs=[printed, fine])
    graded.cells[0].metadata["dp_course_kind"] = "answer"
    back = returned(graded, {"student": "ada", "cells": [{"index": 0, "kind": "answer", "status": "ok"}]})
    text = str(back)
    assert "canary" not in text and "1916947015" not in text and "hello" in text, text


def test_outputs_after_a_fill_cell_are_not_returned():
    # A fill cell (the solution's answer, defined where the student's failed: reference.py) is in the kernel's history
    # from where it ran: an answer cell after it could print it, before any probe ran.
    printed = {"output_type": "stream", "name": "stdout", "text": "hello\n"}
    graded = _notebook(outputs=[printed])
    fill = nbformat.v4.new_code_cell("_probe_fill({'source': 'def add(a, b): return a + b'})")
    fill.metadata["dp_course_kind"] = "fill"
    graded.cells.insert(0, fill)
    back = returned(graded, {"student": "ada", "cells": [{"index": 1, "kind": "answer", "status": "ok"}]})
    [answer] = [c for c in back.cells if c.metadata.get("dp_course")]
    assert "hello" not in str(answer.outputs) and "[grader] this cell ran without error" in str(answer.outputs)
