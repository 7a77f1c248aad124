"""The mistake catalogue (tests/mistakes/labNN.py) through check(): the first line names the mistake and its fix,
and the report holds the details the catalogue asks for.

A mistake whose ranks' run fails (a hang, a crash) must print the launcher's report once, not once per check.
"""
import importlib
import pkgutil

import pytest

from helpers.grading import check
from tests import lab_solution, mistakes

LABS = sorted(module.name for module in pkgutil.iter_modules(mistakes.__path__))
CASES = [(lab, mistake) for lab in LABS for mistake in importlib.import_module(f"tests.mistakes.{lab}").MISTAKES]


@pytest.mark.timeout(180)
@pytest.mark.parametrize("lab, mistake", CASES, ids=[f"{lab} {m.question} {m.name}" for lab, m in CASES])
def test_first_line_names_the_mistake_and_the_fix(lab, mistake, capsys):
    solution = importlib.import_module(f"tests.mistakes.{lab}").SOLUTION
    if isinstance(mistake.override, dict):
        namespace = {**lab_solution.definitions(solution), **mistake.override}
    else:
        namespace = lab_solution.definitions(solution, mistake.override)
    result = check(mistake.question, namespace)
    printed = capsys.readouterr().out
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
