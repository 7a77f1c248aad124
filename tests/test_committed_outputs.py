"""What is committed is what one clean run printed, on no machine in particular.

Chapters are committed executed: every code cell that holds code ran, in order (execution counts increase), and
left its outputs. nbval cannot see a cell committed without running: an empty output compares equal to an empty
output, so a cell that was never run passes and the text after it speaks of figures that are not there.
No committed output of a chapter, lab or solution may hold a path of the machine that ran it (the checkout, a home
directory, a temporary folder, an installation's site-packages): the student release ships these outputs.
"""
import json
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
CHAPTERS = sorted((ROOT / "chapters").glob("*.ipynb"))
NOTEBOOKS = CHAPTERS + sorted(p for d in ("labs", "solutions") for p in (ROOT / d).glob("*.ipynb"))

# A machine's paths: home directories (Linux, macOS, Windows), the root user's home, a temporary folder's
# subdirectory, an installed package's folder, and an absolute path into this repository's own folders.
MACHINE_PATH = re.compile(
    r"/home/[\w.-]+/|/Users/[\w.-]+/|[A-Za-z]:\\\\Users\\\\|/root/|/tmp/[\w.-]+/|site-packages|dist-packages"
    r"|(?:/[\w.-]+)+/(?:chapters|labs|solutions|helpers|tests)/")


def ids(path):
    return f"{path.parent.name}/{path.name}"


def code_cells(path):
    cells = json.loads(path.read_text())["cells"]
    return [(i, c) for i, c in enumerate(cells) if c["cell_type"] == "code"]


def source(cell):
    return "".join(cell["source"])


def output_text(cell):
    """Every string of the cell's outputs (streams, tracebacks, text and HTML representations)."""
    return json.dumps(cell.get("outputs", []))


@pytest.mark.parametrize("path", CHAPTERS, ids=ids)
def test_chapter_ran_in_one_clean_run(path):
    last, problems = 0, []
    for i, cell in code_cells(path):
        if not source(cell).strip():
            continue
        count = cell.get("execution_count")
        if count is None:
            problems.append(f"cell {i} has no execution count (never run)")
        elif count <= last:
            problems.append(f"cell {i} ran as [{count}] after [{last}] (not one run, in order)")
        else:
            last = count
    assert not problems, (f"{ids(path)}: {'; '.join(problems)}; re-execute the whole chapter: cd chapters && "
                          f"../.venv/bin/jupyter nbconvert --to notebook --execute --inplace {path.name}")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=ids)
def test_no_output_holds_a_machine_path(path):
    found = [(i, m.group(0)) for i, cell in code_cells(path) for m in MACHINE_PATH.finditer(output_text(cell))]
    assert not found, (f"{ids(path)}: outputs hold paths of the machine that ran them (cell, path): {found[:5]}; "
                       "print paths relative to the repository and re-execute")


@pytest.mark.parametrize("text, machine", [
    ('File "/work/main/chapters/ops/resumable.py", line 127', True),
    ("/root/.pyenv/versions/3.11.7/lib/python3.11/site-packages/torch/distributed/run.py", True),
    ("C:\\Users\\ada\\course", True),
    ("/home/ada/course/labs/03.ipynb", True),
    ("/tmp/pytest-of-root/pytest-3/x", True),
    ("chapters/ops/resumable.py, line 127", False),
    ("saved to ckpt/step_000040 (relative to chapters/)", False),
    ("a 4-rank launch took 0.05 s", False),
])
def test_the_machine_path_pattern(text, machine):
    assert bool(MACHINE_PATH.search(json.dumps(text))) is machine
