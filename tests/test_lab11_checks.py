"""Lab 11's public checks: the solution passes every one; the given (planted) versions fail, naming the fix.

The catalogue of wrong answers and the first line each must get is tests/mistakes/lab11.py (tests/test_mistakes.py).
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


# The functions the lab gives, each with its planted failure, in place of the answer: the report names the fix.
GIVEN = {
    "11.1": ("class_counts = class_counts_given", "minlength=num_classes"),
    "11.2": ("train_until = train_until_given", "decide on the mean loss over ranks"),
    "11.3": ("train_ddp = train_ddp_given", "find_unused_parameters=True"),
}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("question", GIVEN)
def test_the_given_version_fails_with_the_fix(question):
    override, fix = GIVEN[question]
    lab_solution.assert_report_mentions(question, solution_namespace(override), fix, "Launcher's report")


def test_every_question_has_a_check_cell():
    import nbformat

    cells = [c.source for c in nbformat.read(SOLUTION, as_version=4).cells if c.cell_type == "code"]
    for question in ("11.1", "11.2", "11.3", "11.4"):
        assert f'check("{question}", globals())' in cells, question
