"""Lab 02's public checks: an answer not written yet is reported as to do.

The solution passes every check: tests/test_labs.py runs the solution notebook and asserts each check() result
(this file ran the same checks on the solution's definitions to assert the same). The realistic wrong answers, and
the messages their reports must give, are in the mistake catalogue (tests/mistakes/lab02.py), which
tests/test_mistakes.py drives through check() once each.
"""
import pytest

from helpers.grading import check
from helpers.grading.prepare.labgen import ROOT
from tests.lab_solution import definitions

SOLUTION = ROOT / "solutions" / "02_collectives.ipynb"

STUB = '''
def ring_all_reduce(tensor):
    raise NotImplementedError("lab 2.4")
'''


@pytest.mark.timeout(120)
def test_not_implemented_is_reported_as_todo():
    result = check("2.4", definitions(SOLUTION, STUB))
    assert result.not_implemented == result.total > 0, result.lines
