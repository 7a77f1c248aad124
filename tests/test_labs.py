"""Every lab: labs/ is generated from solutions/, solutions pass all checks, labs run to the end.

The same two runs also exercise the lab's hidden tests (probes): each notebook runs with the grader's probe
cells spliced in after its answers (helpers.grading.prepare.assemble), twice, under two secret seeds. The solution must
pass every probe, and a value that is right for one seed must fail under the other (an answer memorised for
one call is worth nothing); the student version must leave every probe "not implemented". One real lab goes
through the whole grader in tests/grading/test_self_grade.py; running the grader's three kernels for every lab
cost minutes of CI.
"""
import secrets

import nbformat
import papermill
import pytest

from helpers.grading import probes as probe_files
from helpers.grading.check import MIMETYPE
from helpers.grading.prepare.assemble import assemble, probe_source, probe_values
from helpers.grading.prepare.labgen import ROOT, stale_labs, student_source
from tests.warm_kernels import kernel_name

SOLUTIONS = sorted((ROOT / "solutions").glob("[0-9][0-9]_*.ipynb"))
ARTIFACTS = ROOT / "artifacts"


def questions_of(path):
    """Every question whose answer a solution marks."""
    found = []
    for cell in nbformat.read(path, as_version=4).cells:
        if cell.cell_type == "code":
            found += student_source(cell.source)[1]
    return found


def with_probes(path, seeds):
    """(notebook at path with probe cells after its answers, probes, [(question, nonce)]): one probe cell per seed."""
    lab = path.name[:2]
    setup, probes = probe_files.load(lab)
    released = nbformat.read(ROOT / "labs" / path.name, as_version=4)
    notebook, nonces, missing = assemble(released, nbformat.read(path, as_version=4), setup, probes, seeds[0])
    assert not missing, f"{path.name}: no answer cell found for {missing}"
    calls = list(nonces.items())
    for index in reversed(range(len(notebook.cells))):  # more probe cells right after the first, other seeds
        cell = notebook.cells[index]
        question = next((q for q, n in nonces.items() if cell.metadata.get("dp_course_kind") == "probe"
                         and repr(n) in cell.source), None)
        for seed in reversed(seeds[1:] if question else []):
            nonce = secrets.token_hex(8)
            mine = [p for p in probes if p.question == question]
            again = nbformat.v4.new_code_cell(probe_source(question, setup, mine, nonce, seed))
            again.metadata.update(dp_course_kind="probe", dp_course_question=question)
            notebook.cells.insert(index + 1, again)
            calls.append((question, nonce))
    return notebook, probes, calls


def execute(notebook, name, kind):
    """Run a notebook with papermill (its parameters cell as committed: the CI sizes); keep the copy."""
    source = ARTIFACTS / kind / f"{name}.in.ipynb"
    out = ARTIFACTS / kind / name
    out.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(notebook, source)
    return papermill.execute_notebook(str(source), str(out), kernel_name=kernel_name(), cwd=str(ROOT / kind),
                                      progress_bar=False, execution_timeout=300,
                                      # a graceful shutdown waits ~2.6 s for multiprocessing's resource tracker,
                                      # which ignores SIGTERM, until jupyter_client kills the session anyway (measured)
                                      shutdown_kernel="immediate",
                                      # written once at the end (or at the failing cell), not at every cell's start
                                      # and end: each save deep-copies, validates and encodes the whole notebook
                                      # (measured: lab 02's solution 1.2 -> 0.2 CPU-seconds in this process)
                                      request_save_on_cell_execute=False)


def probe_runs(executed, probes, calls):
    """{(question, probe name): [result of each run]}; every run of a probe must have displayed a result."""
    found = {}
    for question, nonce in calls:
        values = probe_values(executed, question, nonce)
        assert values, f"probe cell of {question} displayed nothing (did it fail?)"
        for name, result in values.items():
            found.setdefault((question, name), []).append(result)
    assert set(found) == {(p.question, p.name) for p in probes}, "every probe must have run"
    return found


def check_results(notebook):
    """{question: [result dicts]} from the check() results the notebook displayed."""
    results = {}
    for cell in notebook.cells:
        for output in cell.get("outputs", []):
            data = output.get("data", {})
            if MIMETYPE in data:
                results.setdefault(data[MIMETYPE]["question"], []).append(data[MIMETYPE])
    return results


def test_labs_are_generated_from_solutions():
    assert stale_labs() == [], "run `make labs`: labs/ must be generated from solutions/, never edited"


def test_solutions_are_committed_clean():
    for path in SOLUTIONS:
        for cell in nbformat.read(path, as_version=4).cells:
            assert not cell.get("outputs"), f"{path.name}: commit solutions without outputs"


# Probes whose right answer is the same for every input, by design (a category or a property); every other
# probe's inputs come from the secret seed, so an output memorised for one call scores 0 under another seed.
SAME_FOR_EVERY_INPUT = {
    ("9.1", "one rank: nothing to send, DDP"),                         # a category
    ("9.1", "groups as large as the world, no group"),                 # a category
}
SEEDS = (1234567, 7654321)


@pytest.mark.timeout(600)
@pytest.mark.parametrize("path", SOLUTIONS, ids=lambda p: p.name)
def test_solution_passes_every_check_and_its_probes_change_with_the_secret_seed(path):
    notebook, probes, calls = with_probes(path, SEEDS)
    executed = execute(notebook, path.name, "solutions")
    results = check_results(executed)
    assert set(results) == set(questions_of(path)), "every question needs a check() cell"
    for question, runs in results.items():
        for run in runs:
            assert run["total"] > 0 and run["passed"] == run["total"], f"{question}: {run['lines']}"
    by_name = {(p.question, p.name): p for p in probes}
    lab = str(int(path.name[:2]))
    assert {k for k in SAME_FOR_EVERY_INPUT if k[0].split(".")[0] == lab} <= set(by_name), "an exemption names no probe"
    for key, (first, second) in probe_runs(executed, probes, calls).items():
        assert "value" in first and "value" in second, f"probe {key} fails on the solution: {first}, {second}"
        probe = by_name[key]
        assert probe.grade(second["value"], second["value"], seed=SEEDS[1])[0], f"{key}: the solution fails its judge"
        if key in SAME_FOR_EVERY_INPUT:
            continue
        passed, _ = probe.grade(second["value"], first["value"], seed=SEEDS[1])
        assert not passed, f"probe {key} gives the same value for two secret seeds: an answer memorised for one passes"


@pytest.mark.timeout(600)
@pytest.mark.parametrize("path", SOLUTIONS, ids=lambda p: p.name)
def test_student_lab_runs_to_the_end_not_implemented(path):
    notebook, probes, calls = with_probes(ROOT / "labs" / path.name, SEEDS[:1])
    executed = execute(notebook, path.name, "labs")
    results = check_results(executed)
    assert set(results) == set(questions_of(path))
    for question, runs in results.items():
        for run in runs:
            assert run["not_implemented"] == run["total"] > 0, f"{question}: {run['lines']}"
    for key, (result,) in probe_runs(executed, probes, calls).items():
        assert result.get("error") == "not implemented", f"probe {key} on the student version: {result}"


@pytest.mark.parametrize("path", SOLUTIONS, ids=lambda p: p.name)
def test_every_lab_has_hidden_tests_for_every_question(path):
    _, probes = probe_files.load(path.name[:2])
    assert {p.question for p in probes} == set(questions_of(path))
