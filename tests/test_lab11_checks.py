"""Lab 11's public checks: the solution passes every one.

The given (planted) versions and the other wrong answers, with the first line each must get, are the catalogue
tests/mistakes/lab11.py, run by tests/test_mistakes.py.
"""
import pytest

from helpers.grading import check
from helpers.grading.labgen import ROOT
from tests import lab_solution

SOLUTION = ROOT / "solutions" / "11_operations.ipynb"


def solution_namespace(override=""):
    """The solution's parameters, imports and definitions (no launches), then `override`."""
    return lab_solution.definitions(SOLUTION, override)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("question, total", [("11.1", 2), ("11.2", 3), ("11.3", 2), ("11.4", 2)])
def test_solution_passes(question, total):
    result = check(question, solution_namespace())
    assert result.total == total and result.passed == result.total, result.lines


def test_every_question_has_a_check_cell():
    import nbformat

    cells = [c.source for c in nbformat.read(SOLUTION, as_version=4).cells if c.cell_type == "code"]
    for question in ("11.1", "11.2", "11.3", "11.4"):
        assert f'check("{question}", globals())' in cells, question
