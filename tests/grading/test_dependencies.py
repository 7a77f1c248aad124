"""One mistake, one question: the earlier answers each question's probes call are declared (USES in every probe file),
the declaration is what the code really calls, and the probes run with the solution's versions bound there (for the
questions that use the most of each lab: every used answer is bound in one of them).

The declaration is read against the code (reference.computed_uses: the probe expressions, the SETUP functions they
call, the solution's answers and given code they reach). The binding is proven by poison: every answer a question uses
is replaced by code that raises, and the question's probes still give the solution's values (the scored run), while
the run with the student's own answers fails (the one that only informs). Lab 03 and lab 10 go through the whole
sandboxed grader in tests/grading/test_self_grade.py.
"""
import ast

import nbformat
import pytest

from helpers.grading import probes as probe_files
from helpers.grading.judge import reference
from helpers.grading.prepare.assemble import assemble, question_seed
from helpers.grading.prepare.labgen import ROOT
from helpers.grading.run.execute import Limits
from helpers.grading.run.probe_runtime import evaluate, fill_missing
from helpers.grading.run.sandbox import Fences, kernel_argv
from tests import lab_solution

LABS = sorted(p.name[:2] for p in (ROOT / "solutions").glob("[0-9][0-9]_*.ipynb"))  # every lab


def _solution(lab):
    return nbformat.read(_solution_path(lab), as_version=4)


def _solution_path(lab):
    return next((ROOT / "solutions").glob(f"{lab}_*.ipynb"))


@pytest.mark.parametrize("lab", LABS)
def test_declared_uses_are_what_the_probes_call(lab):
    setup, probes = probe_files.load(lab)
    computed = {q: u for q, u in reference.computed_uses(_solution(lab), setup, probes).items() if u}
    assert probe_files.load_uses(lab) == computed, (
        f"lab {lab}: the probes call {computed}; set USES = {computed!r} in helpers/grading/probes/lab{lab}.py")


def test_a_reference_holds_only_the_answers_used():
    solution = _solution("03")
    ref = reference.for_question(solution, "3.4", ("3.1", "3.3"))
    assert "def shard_indices" in ref["source"] and "def average_gradients" in ref["source"]
    assert "def broadcast_parameters" not in ref["source"] and "def train_manual_ddp" not in ref["source"]
    assert "check(" not in ref["source"] and "BEGIN SOLUTION" not in ref["source"]  # nothing runs; no comments
    assert ref["globals"] == ["average_gradients", "shard_indices"]
    assert reference.for_question(solution, "3.3", ()) is None
    with pytest.raises(ValueError, match="no answer cell"):
        reference.for_question(solution, "3.4", ("3.9",))


def test_lab_08_mixes_the_reference_class_with_the_students_methods():
    ref = reference.for_question(_solution("08"), "8.3", ("8.1",))
    assert ref["classes"] == {"FlatShard": {"base": "ref", "other": ["unshard", "reshard", "reduce_scatter_grads"]}}
    assert "def unshard" not in ref["source"] and "def reshard" not in ref["source"]


def test_a_quoted_message_holding_grader_code_is_caught():
    source = reference.for_question(_solution("03"), "3.4", ("3.3",))["source"]
    line = next(line for line in source.splitlines() if "_flatten_dense_tensors(" in line)
    assert reference.leaked_lines(f"ValueError: {'  '.join(line.split())}", source)
    assert not reference.leaked_lines("ValueError: flat /= dist.get_world_size()", "x = 1\n")
    assert not reference.leaked_lines("ValueError: return x", source)  # a short line proves nothing


def _definitions(lab):
    """The solution's namespace as the references see it: what reference.kept keeps of every cell."""
    return lab_solution.namespace(_solution_path(lab), lambda _: True, transform=lambda _, cell: reference.kept(cell))


def _poison(name):
    def raises(*args, **kwargs):
        raise RuntimeError(f"poisoned {name}")
    return raises


def _body_methods(solution, cls):
    """The methods written in the body of the solution's class `cls`."""
    for cell in solution.cells:
        if cell.cell_type == "code" and f"class {cls}" in cell.source:
            for node in ast.parse(cell.source).body:
                if isinstance(node, ast.ClassDef) and node.name == cls:
                    return [item.name for item in node.body if isinstance(item, ast.FunctionDef)]
    return []


def _poisoned(lab, uses):
    """The solution's namespace with every answer in `uses` replaced by code that raises: functions, the classes'
    constructors and methods, the methods those answers add to a class (lab 08); a class becomes a subclass of the
    solution's whose used parts raise, so what the question itself adds stays the solution's."""
    solution = _solution(lab)
    ns = _definitions(lab)
    parts = reference.components(solution)
    methods = {(cls, m) for q in uses for cls, m in parts[q]["methods"]}
    overrides = {}
    for q in uses:
        for name in parts[q]["classes"]:
            overrides.setdefault(name, {}).update({m: _poison(f"{name}.{m}") for m in _body_methods(solution, name)})
        for name in set(parts[q]["globals"]) - set(parts[q]["classes"]):
            ns[name] = _poison(name)
    for cls, method in methods:
        overrides.setdefault(cls, {})[method] = _poison(f"{cls}.{method}")
    for cls, body in overrides.items():
        original = ns[cls]
        ns[cls] = type(original)(cls, (original,), {**body, "__module__": original.__module__})
    return ns


def _widest(uses):
    """The questions whose uses no other question of the lab strictly contains (2.5 uses all that 2.4 does, and 2.4
    itself): the binding of every used answer is proven at the lowest cost (a probe run of 2.4 is a lab 02 record)."""
    return {q: u for q, u in uses.items() if not any(set(u) < set(other) for other in uses.values())}


CASES = [(lab, q, u) for lab in LABS for q, u in _widest(probe_files.load_uses(lab)).items()]
# Questions that use an earlier answer's class, not its code: lab 08's 8.2-8.4 build their units with the checks'
# reference layout (_ref_init) on the student's FlatShard, whose 8.1 cell must only have defined it.
CLASS_ONLY = {("08", "8.2"), ("08", "8.3"), ("08", "8.4")}


@pytest.mark.timeout(300)
@pytest.mark.parametrize("lab, question, uses", CASES, ids=[f"{lab} {q}" for lab, q, _ in CASES])
def test_the_scored_run_needs_none_of_the_students_earlier_answers(lab, question, uses):
    setup, probes = probe_files.load(lab)
    calls = [(p.name, p.expr) for p in probes if p.question == question]
    seed = question_seed(7, question)
    ref = reference.for_question(_solution(lab), question, uses)
    expected = evaluate(_definitions(lab), setup, calls, seed)["results"]
    got = evaluate(_poisoned(lab, uses), setup, calls, seed, ref)
    by_name = {p.name: p for p in probes}
    for want, mine, own in zip(expected, got["results"], got["own"]):  # grade() derives the question's seed from 7
        assert "value" in mine, f"{question} {want['name']}: {mine}"
        assert by_name[want["name"]].grade(want["value"], mine["value"], seed=7)[0], (question, want["name"])
        assert (lab, question) in CLASS_ONLY or "poisoned" in own.get("error", "") or not by_name[want["name"]].grade(
            want["value"], own.get("value"), seed=7)[0], f"{question} {want['name']}: the poison did not reach it"


@pytest.mark.timeout(300)
def test_an_answer_that_needs_a_missing_class_to_be_defined_gets_the_solutions():
    # Lab 08: the student's 8.1 cell failed, so FlatShard is undefined and 8.2's `@add_to_class(FlatShard)` would
    # raise a NameError. The grader's fill cell before it defines the solution's FlatShard; 8.2 is then graded.
    solution, (setup, probes) = _solution("08"), probe_files.load("08")
    refs = reference.references(solution, probe_files.load_uses("08"))
    graded = assemble(nbformat.read(ROOT / "labs" / _solution_path("08").name, as_version=4), solution, setup,
                      probes, 0, refs)[0]
    kinds = [(c.metadata.get("dp_course_kind"), c.metadata.get("dp_course", {}).get("answers")) for c in graded.cells]
    fills = [kinds[i + 1][1] for i, (kind, _) in enumerate(kinds) if kind == "fill"]
    assert fills == [["8.2"], ["8.3"], ["8.4"]], fills
    ns = _definitions("08")
    del ns["FlatShard"], ns["unshard"], ns["reshard"], ns["reduce_scatter_grads"]
    fill_missing(refs["8.2"], ns)
    answer = next(c for c in solution.cells if "8.2" in reference._questions(c))
    exec(reference.kept(answer), ns)
    probe = next(p for p in probes if p.question == "8.2")
    calls = [(probe.name, probe.expr)]
    got = evaluate(ns, setup, calls, question_seed(7, "8.2"), refs["8.2"], own=False)
    want = evaluate(_definitions("08"), setup, calls, question_seed(7, "8.2"))["results"]
    assert probe.grade(want[0]["value"], got["results"][0]["value"], seed=7)[0], got["results"][0]


def test_the_graded_kernel_keeps_no_history_file():
    # IPython writes every cell it runs into IPYTHONDIR's history.sqlite as it starts it: a kernel run without the
    # flag (no sandbox) let an answer called by a probe read the probe cell there, SETUP and references included.
    limits = Limits(fences=Fences(memory=False, drop_user=False, sandbox=False, pids=False))
    assert "--HistoryManager.enabled=False" in kernel_argv("/tmp/x", limits)
