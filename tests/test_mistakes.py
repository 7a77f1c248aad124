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
from tests.mistake_batch import Batcher

LABS = sorted(module.name for module in pkgutil.iter_modules(mistakes.__path__))
CASES = [(lab, mistake) for lab in LABS for mistake in importlib.import_module(f"tests.mistakes.{lab}").MISTAKES]


IDS = [f"{lab} {m.question} {m.name}" for lab, m in CASES]
_results = {}  # (lab, question, mistake name) -> ("ok", CheckResult) or ("error", exception), until its test reads it
_done = set()  # the keys whose test read its result


def _check(lab, mistake):
    solution = importlib.import_module(f"tests.mistakes.{lab}").SOLUTION
    if isinstance(mistake.override, dict):
        namespace = {**lab_solution.definitions(solution), **mistake.override}
    else:
        namespace = lab_solution.definitions(solution, mistake.override)
    return check(mistake.question, namespace)


def _result(request, lab, mistake):
    """check()'s result for this mistake: the first test of a question runs the question's selected mistakes."""
    key = (lab, mistake.question, mistake.name)
    if key not in _results:
        selected = {item.callspec.id for item in request.session.items
                    if getattr(item, "originalname", None) == request.node.originalname}
        group = [(lab, mistake)] + [(other_lab, other) for (other_lab, other), case_id in zip(CASES, IDS)
                                    if case_id in selected and other_lab == lab and other.question == mistake.question
                                    and other is not mistake and (lab, other.question, other.name) not in _done]
        outcomes = Batcher().run([lambda case=case: _check(*case) for case in group])
        _results.update({(case[0], case[1].question, case[1].name): o for case, o in zip(group, outcomes)})
    _done.add(key)
    status, value = _results.pop(key)
    if status == "error":
        raise value
    return value


@pytest.mark.timeout(180)
@pytest.mark.parametrize("lab, mistake", CASES, ids=IDS)
def test_first_line_names_the_mistake_and_the_fix(lab, mistake, request):
    result = _result(request, lab, mistake)
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
