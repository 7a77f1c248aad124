"""Names an answer uses but the student defined in a cell the grader does not run."""
import nbformat
from nbformat.v4 import new_code_cell, new_notebook

from helpers.grading.prepare.scope import defined, outside_names


def _lab():
    answer = new_code_cell("def add(a, b):\n    raise NotImplementedError('lab 97.1')\n")
    answer.metadata["dp_course"] = {"answers": ["97.1"]}
    return new_notebook(cells=[new_code_cell("import torch\nSCALE = 2"), answer, new_code_cell("check()")])


def _submission(lab, *extra, answer="def add(a, b):\n    return a + b\n"):
    nb = nbformat.from_dict(lab)
    nb.cells[1].source = answer
    nb.cells[2:2] = [new_code_cell(s) for s in extra]
    return nb


def test_a_helper_in_a_cell_of_their_own_is_named():
    lab = _lab()
    nb = _submission(lab, "def _twice(x):\n    return 2 * x\nOFFSET = 1",
                     answer="def add(a, b):\n    return _twice(a) + b + OFFSET * SCALE + torch.zeros(1)\n")
    assert outside_names(lab, nb) == {"97.1": ["OFFSET", "_twice"]}


def test_names_of_the_lab_the_answer_or_builtins_are_fine():
    lab = _lab()
    nb = _submission(lab, "x = 3", answer="import math\ndef add(a, b):\n    n = len([a])\n"
                                          "    return math.fsum([a, b]) * SCALE * n\n")
    assert outside_names(lab, nb) == {}


def test_locals_and_magics_are_not_definitions():
    assert defined("%%ranks 2\ndef f():\n    inner = 1\nfor i in range(2):\n    pass") == {"f", "i"}
    assert defined("def broken(:\n") == set()
