"""Entries of SUBMISSIONS that are not a student's own regular file: refused, never read, never quoted.

The grader reads submissions as the instructor (root, on the course's machine) outside the sandbox: a symlink to the
solution scored 7/7, one to a probe file put its first characters in the feedback, a FIFO held the class for ever,
a symlink to /dev/zero filled memory. Each is a unit here: no kernel starts."""
import os
import pathlib
import time

import nbformat
import pytest

from helpers.grading import grade as grading
from helpers.grading.prepare import submissions
from helpers.grading.report import similarity
from helpers.grading.run.execute import Limits
from helpers.grading.run.grade_student import Task, grade_student
from tests.grading import fixture_lab as lab

pytestmark = pytest.mark.timeout(60)

ROOT = pathlib.Path(__file__).resolve().parents[2]
SOLUTION = ROOT / "solutions" / "01_gradient_averaging.ipynb"
PROBES = ROOT / "helpers" / "grading" / "probes" / "lab01.py"
SECRET = '"""Hidden tests of lab 01: expected 0.3141592'


def _class(tmp_path):
    """A SUBMISSIONS directory with one honest notebook and every kind of entry that is not one."""
    subs = tmp_path / "submissions"
    subs.mkdir(exist_ok=True)
    nbformat.write(nbformat.v4.new_notebook(), subs / "honest.ipynb")
    (subs / "sol_link.ipynb").symlink_to(SOLUTION)
    (subs / "probe_link.ipynb").symlink_to(PROBES)
    (subs / "zero_link.ipynb").symlink_to("/dev/zero")
    (subs / "dangling.ipynb").symlink_to(tmp_path / "nowhere.ipynb")
    os.mkfifo(subs / "fifo.ipynb")
    (subs / "folder.ipynb").mkdir()
    return subs


def _grade_one(tmp_path, path):
    """The result grade_student writes for one path of lab 01 (an unreadable one starts no kernel)."""
    out = tmp_path / "out"
    (out / "results").mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    limits = Limits(grader_memory_bytes=0)  # no memory limit on the test's own process
    result = grade_student(Task("01", None, None, {}, 0, str(out), limits), pathlib.Path(path).stem, str(path))
    return result, time.monotonic() - start


def test_listing_keeps_only_regular_files(tmp_path):
    regular, refused = submissions.listing(_class(tmp_path))
    assert sorted(regular) == ["honest"]
    assert sorted(refused) == ["dangling", "fifo", "folder", "probe_link", "sol_link", "zero_link"]
    assert set(refused.values()) == {submissions.NOT_REGULAR}
    assert "hand in the notebook itself" in submissions.NOT_REGULAR


@pytest.mark.parametrize("name", ["sol_link", "probe_link", "zero_link", "dangling", "fifo", "folder"])
def test_grading_a_non_regular_entry_is_an_error_row_that_quotes_nothing(tmp_path, name):
    # Before: sol_link 7/7, probe_link's feedback began with the probe file's docstring, fifo blocked until the
    # student's hard limit (800 s), zero_link grew memory without bound.
    path = _class(tmp_path) / f"{name}.ipynb"
    result, seconds = _grade_one(tmp_path, path)
    assert result["status"] == "error" and seconds < 5, (result["status"], seconds)
    assert submissions.NOT_REGULAR in result["error"], result["error"]
    assert "Hidden" not in str(result) and sum(m["earned"] for ms in result["marks"].values() for m in ms) == 0


def test_an_unreadable_notebook_is_not_quoted(tmp_path):
    # A regular file whose first characters are a secret the student copied in (or a probe): the message says
    # where the JSON breaks, never what the file holds.
    path = tmp_path / "copied.ipynb"
    path.write_text(SECRET + "\n")
    result, _ = _grade_one(tmp_path, path)
    assert result["status"] == "error" and result["error"].startswith("not a readable notebook"), result["error"]
    assert "line 1" in result["error"] and "save it again from Jupyter" in result["error"], result["error"]
    assert "Hidden" not in str(result) and "0.314" not in str(result), result


def test_a_notebook_over_the_byte_cap_is_refused_with_the_limit(tmp_path, monkeypatch):
    monkeypatch.setattr(submissions, "MAX_BYTES", 1000)
    path = tmp_path / "big.ipynb"
    nbformat.write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("x = 1\n" * 500)]), path)
    with pytest.raises(submissions.SubmissionError, match=r"larger than 1000 bytes.*clear"):
        submissions.read_notebook(path)
    result, _ = _grade_one(tmp_path, path)
    assert result["status"] == "error" and "larger than 1000 bytes" in result["error"], result["error"]


def test_a_regular_notebook_reads_as_before(tmp_path):
    path = tmp_path / "ok.ipynb"
    nbformat.write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("x = 1")]), path)
    assert submissions.read_notebook(path).cells[0].source == "x = 1"


def test_similarity_never_reads_a_non_regular_entry(tmp_path):
    # Before: the FIFO blocked the similarity phase for ever (make grade never exited).
    lab.build(tmp_path)
    released = nbformat.read(grading.lab_notebook(tmp_path / "labs", "97"), as_version=4)
    subs = _class(tmp_path)
    (subs / "secret.ipynb").write_text(SECRET)
    paths = {p.stem: str(p) for p in sorted(subs.glob("*.ipynb"))}
    start = time.monotonic()
    found = similarity.read_class(released, paths)
    assert time.monotonic() - start < 5
    assert {s for s, why in found.unread.items() if why == submissions.NOT_REGULAR} == {
        "dangling", "fifo", "folder", "probe_link", "sol_link", "zero_link"}, found.unread
    assert found.unread["secret"].startswith("not a readable notebook") and "Hidden" not in found.unread["secret"]


def test_the_class_grader_lists_only_regular_files(tmp_path):
    # grade.py's listing: the refused entries are error rows written without starting a grading process.
    subs = _class(tmp_path)
    out = tmp_path / "out"
    (out / "results").mkdir(parents=True)
    regular, refused = submissions.listing(subs)
    grading.refuse(str(out), "01", None, refused)
    for student in refused:
        result = (out / "results" / f"{student}.json").read_text()
        assert submissions.NOT_REGULAR in result and "Hidden" not in result
    assert not (out / "results" / "honest.json").exists()
