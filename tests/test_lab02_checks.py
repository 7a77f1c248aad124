"""Lab 02's public checks: the solution passes them, and an answer not written yet is reported as to do.

The realistic wrong answers, and the messages their reports must give, are in the mistake catalogue
(tests/mistakes/lab02.py), which tests/test_mistakes.py drives through check() once each.
"""
import pytest

from helpers.grading import check
from helpers.grading.labgen import ROOT
from tests.lab_solution import definitions

SOLUTION = ROOT / "solutions" / "02_collectives.ipynb"


def solution_namespace(extra_source=""):
    """The solution's definitions, with extra_source (a wrong answer) replacing one of them."""
    return definitions(SOLUTION, extra_source)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("question", ["2.1", "2.2", "2.3", "2.4", "2.5"])
def test_solution_passes(question):
    result = check(question, solution_namespace())
    assert result.total > 0 and result.passed == result.total, result.lines


STUB = '''
def ring_all_reduce(tensor):
    raise NotImplementedError("lab 2.4")
'''


@pytest.mark.timeout(120)
def test_not_implemented_is_reported_as_todo():
    result = check("2.4", solution_namespace(STUB))
    assert result.not_implemented == result.total > 0, result.lines
