"""The mistake catalogue (tests/mistakes/labNN.py) through check(): the first line names the mistake and its fix,
and the report holds the details the catalogue asks for.

A mistake whose ranks' run fails (a hang, a crash) must print the launcher's report once, not once per check.
The same mistakes go through the hidden tests of their question, judged by the grader (issue 28, part 2): they cost
that question only, and its feedback's first failed line names the mistake the public check names, without a value of
the right answer (the labs of HIDDEN_LABS).
The selected mistakes of one question go through check() together, their launches batched (tests/mistake_batch.py):
the first test of a question runs them all, and each test asserts on its own mistake's report.
"""
import ast
import importlib
import json
import pkgutil
import re
import textwrap

import nbformat
import pytest

from helpers.grading import check
from helpers.grading import probes as probe_files
from helpers.grading.judge import reference
from helpers.grading.prepare.assemble import question_seed
from helpers.grading.run.grade_student import score
from helpers.grading.run.probe_runtime import evaluate
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
_public_first = {}  # test id -> the first line check() printed


@pytest.mark.timeout(180)
@pytest.mark.parametrize("lab, mistake", CASES, ids=IDS)
def test_first_line_names_the_mistake_and_the_fix(lab, mistake, request):
    question = [i for i in selected_ids(request) if BY_ID[i][0] == lab and BY_ID[i][1].question == mistake.question]
    result = _checked.result(request.node.callspec.id, question)
    printed = "\n".join(result.lines)  # what check() printed, less its summary (other mistakes print alongside)
    assert result.passed < result.total, f"{mistake.question} {mistake.name}: the mistake passed every check"
    first = result.lines[0].splitlines()[0]
    _public_first[request.node.callspec.id] = first  # its numbers are the check's own inputs' (the hidden test)
    missing = [fragment for fragment in mistake.first_line if fragment not in first]
    assert not missing, (f"{mistake.question} {mistake.name}: the first line lacks {missing}.\n"
                         f"First line: {first}\nThe whole report:\n{printed}")
    report = "\n".join(result.lines)
    for fragment in mistake.mentions:
        assert fragment in report, f"{mistake.question} {mistake.name}: expected {fragment!r} in the report:\n{report}"
    if mistake.run_fails:
        reports = report.count("Launcher's report")
        assert reports == 1, f"the run's report is printed {reports} times, not once:\n{printed}"


# --- the hidden tests (issue 28, part 2): the grader's feedback teaches as the public check does ---------------------
# The labs whose probes run the public checks' rank functions and whose judges diagnose with the checks' own rules.
HIDDEN_LABS = ("lab01", "lab02", "lab03", "lab04", "lab05", "lab06", "lab07", "lab08", "lab09", "lab10", "lab11",
               "lab12", "lab13")
HIDDEN = [(lab, m) for lab, m in CASES if lab in HIDDEN_LABS]
HIDDEN_IDS = [f"{lab} {m.question} {m.name}" for lab, m in HIDDEN]
SEED = 2026  # the grading run's secret seed, here fixed: each question's own is derived from it


def _probes(lab, question):
    setup, probes = probe_files.load(lab[3:])
    solution = nbformat.read(importlib.import_module(f"tests.mistakes.{lab}").SOLUTION, as_version=4)
    ref = reference.for_question(solution, question, probe_files.load_uses(lab[3:]).get(question, ()))
    return setup, [p for p in probes if p.question == question], ref


def _probe_namespace(lab, override=""):
    """The solution's cells as the graded kernel has them (reference.kept), then the wrong answer."""
    path = importlib.import_module(f"tests.mistakes.{lab}").SOLUTION
    if isinstance(override, dict):
        return {**_probe_namespace(lab), **override}
    return lab_solution.namespace(path, lambda _: True, override, transform=lambda _, cell: reference.kept(cell))


def _probe_values(lab, question, override="", seed=SEED):
    """{probe name: result} of the question's probes on the solution with the wrong answer, as the kernel shows them:
    the earlier answers the question uses are the solution's (USES), the run with the student's own is left out."""
    setup, probes, ref = _probes(lab, question)
    calls = [(p.name, p.expr) for p in probes]
    shown = evaluate(_probe_namespace(lab, override), setup, calls, question_seed(seed, question), ref, own=False)
    return {r["name"]: r for r in json.loads(json.dumps(shown["results"]))}


def _hidden_values(key):
    """A wrong answer's probe values (key: its test id), or the solution's for a seed (key: (lab, question, seed))."""
    if isinstance(key, tuple):
        return _probe_values(*key[:2], seed=key[2])
    lab, mistake = BY_ID[key]
    return _probe_values(lab, mistake.question, mistake.override)


_hidden = Grouped(_hidden_values)  # a question's wrong answers and its solution (2 seeds) together, launches batched
_solutions = {}  # (lab, question, seed) -> the solution's probe values, once read


def _expected(lab, question, seed=SEED):
    key = (lab, question, seed)
    if key not in _solutions:
        _solutions[key] = _hidden.result(key, [key])
    return _solutions[key]


def _numbers(value):
    """Every number in a plain value (tensors' data included), as text of at least two significant characters, as a
    message would print it."""
    if isinstance(value, dict):
        return set().union(*(_numbers(v) for v in value.values())) if value else set()
    if isinstance(value, list):
        return set().union(*(_numbers(v) for v in value)) if value else set()
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return {text for text in (f"{value:.4g}", f"{value:.5g}", f"{value:.4f}", str(value))
                if len(text.lstrip("-0.")) >= 2}
    return set()


@pytest.mark.timeout(300)
@pytest.mark.parametrize("lab, mistake", HIDDEN, ids=HIDDEN_IDS)
def test_hidden_feedback_names_the_mistake_and_costs_only_its_question(lab, mistake, request):
    # Only its question: the wrong answer redefines only that question's answers (and helpers of its own), and every
    # other question's probes call them, if at all, through the solution's versions (USES; the isolation is proven
    # in tests/grading/test_dependencies.py and, sandboxed, in tests/grading/test_self_grade.py).
    solution = nbformat.read(importlib.import_module(f"tests.mistakes.{lab}").SOLUTION, as_version=4)
    mine = set(reference.components(solution)[mistake.question]["globals"])
    redefined = (set(mistake.override) if isinstance(mistake.override, dict)
                 else {n.name for n in ast.parse(textwrap.dedent(mistake.override)).body
                       if isinstance(n, (ast.FunctionDef, ast.ClassDef))})
    assert {n for n in redefined - mine if not n.startswith("_")} == set(), f"{mistake.name} redefines other answers"
    group = [i for i in selected_ids(request) if i in HIDDEN_IDS and BY_ID[i][1].question == mistake.question
             and BY_ID[i][0] == lab]
    solutions = [(lab, mistake.question, SEED)] if (lab, mistake.question, SEED) not in _solutions else []
    values = _hidden.result(request.node.callspec.id, group + solutions)
    _, probes, _ = _probes(lab, mistake.question)
    expected = _expected(lab, mistake.question)
    assert all("value" in r for r in expected.values()), f"the solution fails its probes: {expected}"
    marks = score(probes, {mistake.question: expected}, {mistake.question: values}, {}, SEED)[mistake.question]
    failed = [m for m in marks if m["earned"] < m["points"]]
    assert failed, f"{mistake.question} {mistake.name}: the hidden tests give full marks"
    first = failed[0]["message"]  # the first failed line of the question in the feedback
    missing = [f for f in (mistake.hidden or mistake.first_line) if f not in first]
    assert not missing, f"{mistake.question} {mistake.name}: the hidden feedback lacks {missing}: {first}"
    # The right answer's values are the tensors' floats (a count, a size or a world size is the check's own input,
    # public): none may be in the line.
    # A difference printed with 3 digits may meet one of thousands of values by chance: 4 digits or more count.
    tokens = {t for t in re.findall(r"(?<![\w.])-?\d+\.\d+(?:e[-+]?\d+)?", first)
              if len(t.split("e")[0].replace("-", "").replace(".", "").lstrip("0")) >= 4}
    public = _public_first.get(request.node.callspec.id)  # the check prints them too: a ratio, a constant
    if public is None:  # its test was not selected: run the public check here
        public = _checked.result(request.node.callspec.id, [request.node.callspec.id]).lines[0].splitlines()[0]
    leaked = {t for t in tokens & _numbers([r["value"] for r in expected.values()]) if t not in public}
    assert not leaked, f"{mistake.question} {mistake.name}: the hidden feedback quotes right values {leaked}: {first}"
