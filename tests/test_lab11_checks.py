"""Lab 11's public checks: there are as many as the lab says, and a check() cell for every question.

The solution passes every check: tests/test_labs.py runs the solution notebook and asserts each check() result
(this file ran the same checks on the solution's definitions to assert the same).

The given (planted) versions and the other wrong answers, with the first line each must get, are the catalogue
tests/mistakes/lab11.py, run by tests/test_mistakes.py.
"""
import pytest

from helpers.grading.registry import checks_for


@pytest.mark.parametrize("question, total", [("11.1", 2), ("11.2", 3), ("11.3", 2), ("11.4", 3)])
def test_every_question_has_its_number_of_checks(question, total):
    assert len(checks_for(question)) == total
