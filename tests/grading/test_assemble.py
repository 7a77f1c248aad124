"""The graded notebook: released cells, the submission's answers, one probe cell per question."""
import nbformat

from helpers.grading.prepare.assemble import assemble
from helpers.grading.probes import Probe
from helpers.grading.run.execute import _graded_code


def lab(*cells):
    """A notebook of (source, questions) code cells; questions tag answer cells as `make labs` does."""
    nb = nbformat.v4.new_notebook()
    for i, (source, questions) in enumerate(cells):
        cell = nbformat.v4.new_code_cell(source)
        cell["id"] = f"cell-{i}"
        if questions:
            cell.metadata["dp_course"] = {"answers": questions}
        nb.cells.append(cell)
    return nb


RELEASED = lab(("import torch", []), ("def f():\n    raise NotImplementedError", ["1.1"]),
               ("check('1.1', globals())", []), ("def g():\n    raise NotImplementedError", ["1.2"]),
               ("def h():\n    raise NotImplementedError", ["1.2"]))
PROBES = [Probe("1.1", "f", "f()"), Probe("1.2", "g", "g()"), Probe("1.2", "h", "h()")]


def kinds(notebook):
    return [c.metadata["dp_course_kind"] for c in notebook.cells]


def test_answers_come_from_the_submission_everything_else_from_the_release():
    submission = lab(("import os; os.system('evil')", []), ("def f():\n    return 1", ["1.1"]),
                     ("print('all checks passed')", []), ("def g():\n    return 2", ["1.2"]),
                     ("def h():\n    return 3", ["1.2"]))
    graded, nonces, missing = assemble(RELEASED, submission, "", PROBES, 0)
    assert missing == [] and set(nonces) == {"1.1", "1.2"}
    assert graded.cells[0].source == "import torch"
    assert graded.cells[1].source == "def f():\n    return 1"
    assert graded.cells[3].source == "check('1.1', globals())"


def test_a_question_spanning_two_cells_is_probed_once_after_its_last_cell():
    graded, nonces, _ = assemble(RELEASED, RELEASED, "", PROBES, 0)
    assert kinds(graded) == ["lab", "answer", "probe", "check", "answer", "answer", "probe"]
    assert repr(nonces["1.2"]) in graded.cells[-1].source and "g()" in graded.cells[-1].source


def test_a_missing_answer_cell_is_reported():
    submission = lab(("def f():\n    return 1", ["1.1"]))
    _, _, missing = assemble(RELEASED, submission, "", PROBES, 0)
    assert "1.2" in missing


def test_a_cell_with_two_regions_of_one_question_is_probed_once():
    # Lab 04's Bucket holds two regions of 4.2 in one cell: its probes ran twice, and the first cell's result, under
    # another nonce, read as a forgery.
    released = lab(("class B:\n    def a(self):\n        raise NotImplementedError\n"
                    "    def b(self):\n        raise NotImplementedError", ["1.1", "1.1"]))
    graded, nonces, _ = assemble(released, released, "", PROBES[:1], 0)
    assert kinds(graded) == ["answer", "probe"] and repr(nonces["1.1"]) in graded.cells[-1].source


def test_lab_cells_after_the_last_answer_are_not_graded():
    # They run after every probe (lab 10's closing training run, ~3 s): the grader skips them, checks too.
    released = lab(("import torch", []), ("def f():\n    raise NotImplementedError", ["1.1"]),
                   ("check('1.1', globals())", []), ("f()  # the lab's closing run", []))
    graded, _, _ = assemble(released, released, "", PROBES[:1], 0)
    assert kinds(graded) == ["lab", "answer", "probe", "check", "after"]
    assert [_graded_code(c) for c in graded.cells] == [True, True, True, False, False]
