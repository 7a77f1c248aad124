"""Every lab: labs/ is generated from solutions/, solutions pass all checks, labs run to the end."""
import pathlib

import nbformat
import papermill
import pytest

from helpers.grading.check import MIMETYPE
from helpers.grading.labgen import ROOT, stale_labs, student_source

SOLUTIONS = sorted((ROOT / "solutions").glob("[0-9][0-9]_*.ipynb"))
ARTIFACTS = ROOT / "artifacts"


def questions_of(path):
    """Every question whose answer a solution marks."""
    found = []
    for cell in nbformat.read(path, as_version=4).cells:
        if cell.cell_type == "code":
            found += student_source(cell.source)[1]
    return found


def execute(path, kind):
    """Run a notebook with papermill (its parameters cell as committed: the CI sizes); keep the copy."""
    out = ARTIFACTS / kind / path.name
    out.parent.mkdir(parents=True, exist_ok=True)
    papermill.execute_notebook(str(path), str(out), kernel_name="python3", cwd=str(path.parent),
                               progress_bar=False, execution_timeout=300)
    return nbformat.read(out, as_version=4)


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


@pytest.mark.timeout(600)
@pytest.mark.parametrize("path", SOLUTIONS, ids=lambda p: p.name)
def test_solution_passes_every_check(path):
    results = check_results(execute(path, "solutions"))
    assert set(results) == set(questions_of(path)), "every question needs a check() cell"
    for question, runs in results.items():
        for run in runs:
            assert run["total"] > 0 and run["passed"] == run["total"], f"{question}: {run['lines']}"


@pytest.mark.timeout(600)
@pytest.mark.parametrize("path", SOLUTIONS, ids=lambda p: p.name)
def test_student_lab_runs_to_the_end_not_implemented(path):
    lab = ROOT / "labs" / path.name
    results = check_results(execute(lab, "labs"))
    assert set(results) == set(questions_of(path))
    for question, runs in results.items():
        for run in runs:
            assert run["not_implemented"] == run["total"] > 0, f"{question}: {run['lines']}"
