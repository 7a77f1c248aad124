"""The mistake catalogue (tests/mistakes/labNN.py) through check(): the first line names the mistake and its fix,
and the report holds the details the catalogue asks for.

A mistake whose ranks' run fails (a hang, a crash) must print the launcher's report once, not once per check.
The selected mistakes of one question go through check() together, their launches batched (tests/mistake_batch.py):
the first test of a question runs them all, and each test asserts on its own mistake's report.
"""
import importlib
import pkgutil

import pytest

from helpers.grading import check
from tests import lab_solution, mistakes
from tests.mistake_batch import Grouped, selected_ids

LABS = sorted(module.name for module in pkgutil.iter_modules(mistakes.__path__))
CASES = [(lab, mistake) for lab in LABS for mistake in importlib.import_module(f"tests.mistakes.{lab}").MISTAKES]


IDS = [f"{lab} {m.question} {m.name}" for lab, m in CASES]
BY_ID = dict(zip(IDS, CASES))


def _check(case_id):
    lab, mistake = BY_ID[case_id]
    solution = importlib.import_module(f"tests.mistakes.{lab}").SOLUTION
    if isinstance(mistake.override, dict):
        namespace = {**lab_solution.definitions(solution), **mistake.override}
    else:
        namespace = lab_solution.definitions(solution, mistake.override)
    return check(mistake.question, namespace)


_checked = Grouped(_check)  # the mistakes of one question (the selected ones) go through check() together


@pytest.mark.timeout(180)
@pytest.mark.parametrize("lab, mistake", CASES, ids=IDS)
def test_first_line_names_the_mistake_and_the_fix(lab, mistake, request):
    question = [i for i in selected_ids(request) if BY_ID[i][0] == lab and BY_ID[i][1].question == mistake.question]
    result = _checked.result(request.node.callspec.id, question)
    printed = "\n".join(result.lines)  # what check() printed, less its summary (other mistakes print alongside)
    assert result.passed < result.total, f"{mistake.question} {mistake.name}: the mistake passed every check"
    first = result.lines[0].splitlines()[0]
    missing = [fragment for fragment in mistake.first_line if fragment not in first]
    assert not missing, (f"{mistake.question} {mistake.name}: the first line lacks {missing}.\n"
                         f"First line: {first}\nThe whole report:\n{printed}")
    report = "\n".join(result.lines)
    for fragment in mistake.mentions:
        assert fragment in report, f"{mistake.question} {mistake.name}: expected {fragment!r} in the report:\n{report}"
    if mistake.run_fails:
        reports = report.count("Launcher's report")
        assert reports == 1, f"the run's report is printed {reports} times, not once:\n{printed}"
