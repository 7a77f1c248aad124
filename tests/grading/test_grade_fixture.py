"""The grader on a class of honest and adversarial submissions of a small lab (97)."""
import csv
import time

import nbformat
import pytest

from helpers.grading import grade as grading
from tests.grading import fixture_lab as lab

pytestmark = pytest.mark.timeout(600)

CORRECT_ADD = lab.ADD
CORRECT_SUM = lab.RANK_SUM
WRONG_SUM = "from helpers import launch\ndef rank_sum(world_size):\n    return 0.0\n"


def _replace_check(nb):
    nb.cells[3].source = "print('all checks passed: score 100')"


SUBMISSIONS = {
    # student: (add cell, rank_sum cell, other edit, expected 97.1, expected 97.2, expected status)
    "correct": (CORRECT_ADD, CORRECT_SUM, None, 2, 2, "ok"),
    "partly": (CORRECT_ADD, WRONG_SUM, None, 2, 0, "ok"),
    "syntax_error": ("def add(a, b:\n    return a + b\n", CORRECT_SUM, None, 0, 2, "error"),
    "infinite_loop": ("def add(a, b):\n    return a + b\nwhile True:\n    pass\n", CORRECT_SUM, None, 2, 2, "timeout"),
    "deadlock_in_ranks": (CORRECT_ADD, "%%ranks 2 --hang-timeout 600\nimport torch.distributed as dist\n"
                          "if dist.get_rank() == 0:\n    dist.barrier()\n", None, 2, 0, "timeout"),
    "os_exit": (CORRECT_ADD, "import os\nos._exit(1)\n", None, 2, 0, "dead_kernel"),
    "memory_bomb": (CORRECT_ADD + "hog = bytearray(64 * 2**30)\n", CORRECT_SUM, None, 2, 2, "error"),
    "fake_score": ("print('score 100')\ndef add(a, b):\n    return a - b\n", WRONG_SUM, None, 0, 0, "ok"),
    "monkeypatch": ("import torch, helpers.grading, helpers.grading.plain\n"
                    "torch.allclose = lambda *a, **k: True\ntorch.equal = lambda *a, **k: True\n"
                    "helpers.grading.check = lambda *a, **k: None\n"
                    "helpers.grading.plain.compare = lambda *a, **k: (True, '')\n"
                    "def add(a, b):\n    return a * 0\n", WRONG_SUM, None, 0, 0, "ok"),
    "edits_check_cell": (CORRECT_ADD, CORRECT_SUM, _replace_check, 2, 2, "ok"),
    "deletes_files": ("import os, shutil\nfor f in os.listdir('.'):\n    shutil.rmtree(f, ignore_errors=True)\n"
                      + CORRECT_ADD, CORRECT_SUM, None, 2, 2, "ok"),
    "reads_probes": ("import glob\nfound = glob.glob('/tmp/**/lab97.py', recursive=True)\n"
                     "print('found probes:', found)\n" + CORRECT_ADD, WRONG_SUM, None, 2, 0, "ok"),
    "not_started": (None, None, None, 0, 0, "ok"),
}


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    root = tmp_path_factory.mktemp("lab97")
    lab.build(root)
    for student, (add, rank_sum, edit, *_rest) in SUBMISSIONS.items():
        lab.submission(root, student, add, rank_sum, edit)
    (root / "submissions" / "garbage.ipynb").write_text("{ not a notebook")
    out = root / "out"
    limits = grading.default_limits([root / "probes", root / "solutions", root / "submissions", out])
    # Generous: a cold forkserver start under a loaded CI machine takes several seconds.
    limits.cell_seconds, limits.total_seconds, limits.memory_bytes = 30.0, 150.0, 3 * 2**30
    start = time.monotonic()
    results = grading.grade("97", root / "submissions", out, probes_dir=root / "probes", jobs=2, limits=limits,
                            labs_dir=root / "labs", solutions_dir=root / "solutions")
    seconds = time.monotonic() - start
    with open(out / "grades.csv") as f:
        rows = {row["student"]: row for row in csv.DictReader(f)}
    return root, out, rows, results, seconds


@pytest.mark.parametrize("student", sorted(SUBMISSIONS))
def test_each_submission_graded_as_it_deserves(graded, student):
    _, _, rows, _, _ = graded
    *_, q1, q2, status = SUBMISSIONS[student]
    row = rows[student]
    assert (float(row["97.1"]), float(row["97.2"]), row["status"]) == (q1, q2, status), row
    assert row["max"] == "4" and float(row["total"]) == q1 + q2


def test_unreadable_notebook_is_an_error_row(graded):
    _, out, rows, _, _ = graded
    assert rows["garbage"]["status"] == "error" and rows["garbage"]["total"] == "0"
    assert "could not be read" in (out / "feedback" / "garbage.md").read_text()


def test_feedback_names_probes_but_never_their_source_or_values(graded):
    _, out, _, _, _ = graded
    text = (out / "feedback" / "partly.md").read_text()
    assert "three ranks: failed: wrong value" in text and "adds two vectors: passed" in text
    assert "rank_sum(3)" not in text and "_probe_torch" not in text and "3.0" not in text


def test_edited_check_cell_is_replaced_by_the_released_one(graded):
    _, out, _, _, _ = graded
    executed = nbformat.read(out / "executed" / "edits_check_cell.ipynb", as_version=4)
    assert 'check("97.1", globals())' in [c.source for c in executed.cells]
    assert "score 100" not in str(executed.cells)


def test_cell_log_and_columns(graded):
    _, out, _, _, _ = graded
    with open(out / "grades.csv") as f:
        assert next(csv.reader(f)) == ["student", "97.1", "97.2", "total", "max", "status", "seconds"]
    with open(out / "cells.csv") as f:
        log = list(csv.DictReader(f))
    assert {"ok", "timeout"} <= {row["status"] for row in log if row["student"] == "infinite_loop"}


def test_sandbox_hid_the_probes_when_root(graded):
    _, out, _, _, _ = graded
    if not grading.default_limits([]).isolate_network:
        pytest.skip("no mount namespace here (not root): probes are readable, as the README says")
    root = out.parent
    executed = nbformat.read(out / "executed" / "reads_probes.ipynb", as_version=4)
    found = str(executed.cells[2].outputs)
    assert "found probes:" in found and str(root / "probes" / "lab97.py") not in found


def test_batch_time(graded):
    *_, seconds = graded
    print(f"graded {len(SUBMISSIONS) + 1} submissions in {seconds:.1f} s")
