"""One student can never cost the class its results (issue 29): a name or a text a student controls is written safely,
and what their kernel sends is theirs to answer for.

The class (lab 97 of fixture_lab.py, with a report graded by hand as lab 10's is): a notebook whose file name is not
UTF-8 (what an old zip unpacks to), a report holding half a surrogate pair, names that could be the grader's own files
(`grader`, `state`, `CON`, `..`, a trailing dot), and a student whose answer sends malformed messages on iopub through
its kernel's own session. Before: `make grade` exited 2 with an empty grades.csv, no feedback and no LMS file for
anyone, and RESUME=1 the same. Two students are graded by kernels (and the solution): about 7 CPU-s in all (its cpuacct
cgroup, less pytest's start), 13-20 s of wall time.
"""
import csv
import json
import os
import pathlib
import random
import time
import tracemalloc

import nbformat
import pytest

from helpers.grading import grade as grading
from helpers.grading import probes as probe_files
from helpers.grading.judge import redact
from helpers.grading.prepare import submissions
from helpers.grading.probes import shortcuts
from helpers.grading.report import manual, report, returns, similarity
from helpers.grading.run import grade_student
from helpers.grading.run.execute import Limits
from tests.grading import fixture_lab as lab

pytestmark = pytest.mark.timeout(600)

REPORT = "## Report\n\nWrite your analysis here."
MANUAL = '\nfrom helpers.grading.probes import Manual\nMANUAL = [Manual("97.3", "the report", 2, "report")]\n'

# Raw JSON bytes the student's kernel signs and sends as a message's content, one per kind of mistake: wrong field
# types, missing fields, NaN, deep nesting, a bad base64 image, half a surrogate pair, JSON that is not.
MALFORMED = r'''
k = get_ipython().kernel
for kind, content in [
        ("clear_output", b'{"wait": "yes"}'), ("stream", b'{"name": 5, "text": null}'),
        ("stream", b'{"name": "stdout", "text": "half \\ud800 a pair"}'),
        ("display_data", b'{"data": "not a bundle", "metadata": []}'),
        ("execute_result", b'{"data": {"text/plain": 7, "image/png": "!!", "1": "x"}, "execution_count": "x"}'),
        ("display_data", b'{"data": {"application/json": ' + b'[' * 3000 + b']' * 3000 + b'}, "metadata": {}}'),
        ("display_data", b'{"data": {"application/json": {"v": NaN}}, "metadata": {}}'),
        ("error", b'{"ename": null, "evalue": [], "traceback": "tb"}'),
        ("update_display_data", b'{"data": {}, "transient": {"display_id": 5}}'), ("status", b'{}'),
        ("comm_msg", b'{"comm_id": 1}'), ("surprise", b'{"x": 1}'), ("stream", b'{not json'), ("stream", b'[1, 2]')]:
    k.session.send(k.iopub_socket, kind, content, parent=k.get_parent())
'''


@pytest.fixture(scope="module")
def hostile_class(tmp_path_factory):
    root = tmp_path_factory.mktemp("names")
    lab.build(root)
    for sub in ("labs", "solutions"):
        path = root / sub / "97_fixture.ipynb"
        nb = nbformat.read(path, as_version=4)
        nb.cells.append(nbformat.v4.new_markdown_cell(REPORT, id="report"))
        nbformat.write(nb, path)
    with open(root / "probes" / "lab97.py", "a") as f:
        f.write(MANUAL)
    subs = root / "submissions"
    # state: honest, named as OUT/state.json; surrogate: half a pair in its report, malformed messages from 97.2.
    nb = nbformat.read(lab.submission(root, "state", lab.ADD, lab.RANK_SUM), as_version=4)
    nb.cells[-1].source = "## Report\n\nThe all-reduce took 3 ms."
    nbformat.write(nb, subs / "state.ipynb")
    nb.cells[-1].source = "## Report\n\nThe all-reduce took 3 ms \ud800 on 2 ranks."
    nb.cells[4].source = lab.RANK_SUM + MALFORMED  # after 97.1's probes: 97.1 stands
    (subs / "surrogate.ipynb").write_text(json.dumps(nb))  # JSON escapes the half pair: "\ud800"
    honest = (subs / "state.ipynb").read_bytes()
    for name in (b"caf\xe9", b"grader", b"CON", b"..", b"trailing.", b"new\nline"):
        with open(os.path.join(os.fsencode(subs), name + b".ipynb"), "wb") as f:
            f.write(honest)
    out = root / "out"
    args = ["--lab", "97", "--submissions", str(subs), "--out", str(out), "--probes", str(root / "probes"),
            "--solutions", str(root / "solutions"), "--labs", str(root / "labs"), "--format", "canvas"]
    code = grading.main(args)
    return root, out, args, code


def _rows(out):
    with open(out / "grades.csv", newline="", encoding="utf-8") as f:
        return {row["student"]: row for row in csv.DictReader(f)}


REFUSED = {"%caf%E9": "caf\\xe9.ipynb: its file name is not UTF-8 text", "%grader": "grader.ipynb: its file name is "
           "the grader's own log's", "%CON": "CON.ipynb: its file name is one Windows reserves",
           "%%2E%2E": "...ipynb: its file name starts with a dot", "%trailing%2E": "trailing..ipynb: its file name "
           "ends in a dot", "%new%0Aline": "new\\nline.ipynb: its file name holds a control"}


def test_every_student_has_a_row_and_feedback(hostile_class):
    _, out, _, code = hostile_class
    assert code == 0
    rows = _rows(out)
    assert set(rows) == {"state", "surrogate", *REFUSED}, sorted(rows)
    assert (rows["state"]["total"], rows["state"]["status"], rows["state"]["by_hand"]) == ("4", "ok", "pending")
    for student, why in REFUSED.items():
        assert rows[student]["status"] == "error", rows[student]
        feedback = (out / "feedback" / f"{student}.md").read_text(encoding="utf-8")
        assert why in feedback and "rename the file to the student's id" in feedback, feedback
        assert (out / "return" / student / "feedback.md").is_file()
    assert json.loads((out / "state.json").read_text())["seed"], "a student named state wrote over the run's state"
    similar = (out / "similarity.md").read_text(encoding="utf-8")
    assert "- %caf%E9: caf\\xe9.ipynb: its file name is not UTF-8 text" in similar, similar[-1500:]
    assert "surrogate" in (out / "gradebook-canvas.csv").read_text(encoding="utf-8")


def test_half_a_surrogate_pair_is_written_as_a_replacement_character(hostile_class):
    _, out, _, _ = hostile_class
    text = (out / "manual" / "97.3" / "surrogate.md").read_text(encoding="utf-8")
    assert "took 3 ms \ufffd on 2 ranks" in text
    with open(out / "manual.csv", newline="", encoding="utf-8") as f:
        assert {(r["student"], r["words"]) for r in csv.DictReader(f)} >= {("surrogate", "11"), ("state", "7")}


def test_malformed_kernel_messages_are_the_students_and_cost_nothing_else(hostile_class):
    _, out, _, _ = hostile_class
    row = _rows(out)["surrogate"]
    # 97.2 reached its kernel's shell (get_ipython): 0 by the shortcut rule (probes/shortcuts.py); its error message
    # is an error output like any other.
    assert (row["97.1"], row["97.2"], row["status"]) == ("2", "0", "error"), row
    executed = nbformat.read(out / "executed" / "surrogate.ipynb", as_version=4)
    said = json.dumps([c.get("outputs", []) for c in executed.cells], ensure_ascii=False)
    assert "malformed message(s) from the kernel dropped" in said and "half \ufffd a pair" in said
    nbformat.validate(executed)


def test_no_name_writes_a_file_of_the_graders(hostile_class):
    root, out, _, _ = hostile_class
    log = (out / "logs" / "grader.log")
    assert not log.exists() or "all-reduce" not in log.read_text(errors="replace")
    assert not (out / "logs" / "%grader.log").exists(), "a refused entry is never run"
    top = {p.name for p in out.iterdir() if p.is_file()}  # the grader's files; a student's are in folders
    assert {"cells.csv", "grades.csv", "gradebook-canvas.csv", "manual.csv", "similarity.md", "state.json"} <= top
    assert not any("%" in name or name.startswith(("surrogate", "caf")) for name in top), sorted(top)
    assert not list(out.parent.glob("*.json")), "nothing outside OUT"


def test_resume_finishes_the_class(hostile_class, capsys):
    _, out, args, _ = hostile_class
    before = _rows(out)
    assert grading.main([*args, "--resume"]) == 0
    assert "graded 0 submissions (8 kept from the earlier run)" in capsys.readouterr().out
    assert _rows(out) == before


def test_ids_never_collide():
    names = ["caf\udce9", "CON", "con.txt", "x.", "..", ".", "grader", "a%b", "x" * 300, "a\u202eb"]
    ids = [submissions.refused_id(n) for n in names]
    assert all(submissions.name_problem(n) for n in names)
    assert len(set(ids)) == len(ids) and all(i.startswith("%") and len(i) <= 100 for i in ids), ids
    for good in ("alice", "José", "alice smith", "state", "grades", "s.1"):
        assert submissions.name_problem(good) is None, good
    assert pathlib.Path("x").name  # ids are file names of their own: no "/" in any
    assert not any("/" in i or "\\" in i for i in ids)


def _results(students, probes):
    marks = {}
    for p in probes:
        marks.setdefault(p.question, []).append({"name": p.name, "points": p.points, "earned": p.points,
                                                 "message": "ok"})
    return [{"student": s, "status": "ok", "missing": [], "cells": [], "kernels": 1, "seconds": 1.0, "marks": marks}
            for s in students]


def test_a_step_that_fails_for_one_student_writes_everyone_elses(tmp_path, monkeypatch):
    # Held back from the attack round: whatever one student's result or notebook makes a report step raise, the others
    # get their feedback, returned notebook and similarity pairs; the one gets their points and a line saying why.
    lab.build(tmp_path)
    probes = probe_files.load("97", tmp_path / "probes")[1]
    out = tmp_path / "out"
    for sub in ("feedback", "logs", "executed", "return"):
        (out / sub).mkdir(parents=True)
    results = _results(["ann", "bob", "cy"], probes)
    real = report.feedback_markdown

    def fails_for_bob(result, *args, **kwargs):
        if result["student"] == "bob":
            raise KeyError("marks")
        return real(result, *args, **kwargs)

    monkeypatch.setattr(report, "feedback_markdown", fails_for_bob)
    report.write_outputs(out, probes, results)
    assert "Score: 4 / 4" in (out / "feedback" / "ann.md").read_text() and (out / "feedback" / "cy.md").is_file()
    assert "could not write this feedback (KeyError)" in (out / "feedback" / "bob.md").read_text()
    assert "bob: the grader could not write this feedback (KeyError)" in (out / "logs" / "grader.log").read_text()
    (out / "executed" / "bob.ipynb").write_text("{ not a notebook")  # what no grader writes: returns go on
    returns.write_all(out, results, "97_fixture.ipynb")
    assert all((out / "return" / s / "feedback.md").is_file() for s in ("ann", "bob", "cy"))
    assert "bob: the returned notebook could not be written" in (out / "logs" / "grader.log").read_text()
    released = nbformat.read(tmp_path / "labs" / "97_fixture.ipynb", as_version=4)
    paths = {s: lab.submission(tmp_path, s, None, lab.GATHER_SUM) for s in ("ann", "bob", "cy")}
    answer = similarity.student_answer
    monkeypatch.setattr(similarity, "student_answer", lambda student, *a: answer(student, *a) if student != "bob"
                        else 1 / 0)
    found = similarity.read_class(released, paths)
    assert found.unread == {"bob": "not compared: reading the answers raised ZeroDivisionError"}
    assert [a.student for a in found.answers["97.2"]] == ["ann", "cy"]


def test_an_answer_of_ipython_syntax_is_scanned_in_a_bounded_time():
    # 600 lines of `a?` in an answer: the scan (probes/shortcuts.py, in the student's grading process) had IPython
    # rewrite each, tokenising the cell again every time (7 CPU-s), then raise RuntimeError past 500: the process
    # died, grader_error on every re-grade. One rewrite finds the first such line.
    source = "def add(a, b):\n    return a + b\n" + "a?\n" * 3_000
    start = time.process_time()
    assert shortcuts.ipython_syntax(source) == "a?"
    assert time.process_time() - start < 0.5


def test_what_grading_a_notebook_raises_is_that_students_error(tmp_path, monkeypatch):
    # Whatever a notebook makes the grader raise past its messages (a judge, the scan, writing its executed notebook)
    # is that student's `error`, every question 0, the traceback in the grader's log: before, the process died, a
    # grader_error on every re-grade and a blank LMS grade.
    lab.build(tmp_path)
    path = lab.submission(tmp_path, "ann", lab.ADD, lab.RANK_SUM)
    out = tmp_path / "out"
    for sub in ("results", "logs"):
        (out / sub).mkdir(parents=True)
    monkeypatch.setattr(grade_student, "limit_this_process", lambda *args: None)  # not the test's own process

    def raises(*args):
        raise KeyError("data")

    monkeypatch.setattr(grade_student, "_graded", raises)
    released = nbformat.read(tmp_path / "labs" / "97_fixture.ipynb", as_version=4)
    task = grade_student.Task("97", released, str(tmp_path / "probes"), {}, 1, str(out), Limits())
    result = grade_student.grade_student(task, "ann", str(path))
    assert result["status"] == "error" and "raised KeyError in the grader" in result["error"]
    assert all(m["earned"] == 0 for marks in result["marks"].values() for m in marks)
    assert "ann: grading raised" in (out / "logs" / "grader.log").read_text()
    assert json.loads((out / "results" / "ann.json").read_text())["status"] == "error"


def test_a_report_of_megabytes_is_copied_up_to_its_cap():
    released = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell(REPORT, id="report")])
    mine = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell("## Report\n\n" + "word " * 400_000,
                                                                         id="report")])
    [item] = [probe_files.Manual("97.3", "the report", 2, "report")]
    text = manual.texts(released, mine, [item])["97.3"]
    assert len(text) < manual.MAX_TEXT_CHARS + 200 and text.endswith("read them in the student's notebook")


def test_the_secrets_of_a_notebook_with_a_huge_answer_cost_a_bounded_time():
    # The feedback and the returns of the whole class, in the grader's own process, list each student's secrets
    # (judge/redact.py): a probe cell's 16-letter windows that the notebook's other cells do not hold. An answer cell
    # of 4 MB of letters made a set of 4 million windows first: 2.5 CPU-s and 550 MiB for one student, and a notebook
    # of 40 MB (under the 50 MiB cap) 10 times that. Only the windows a probe cell holds are looked up, on each
    # cell's first characters (a window shared further on stays secret: withheld, never shown).
    rng = random.Random(0)
    answer = rng.randbytes(4_000_000).translate(bytes(97 + i % 26 for i in range(256))).decode()  # letters
    graded = {"cells": [{"cell_type": "code", "source": "_probe_run('9.9', 'import torch as _probe_torch')",
                         "metadata": {"dp_course_kind": "probe"}},
                        {"cell_type": "code", "source": answer, "metadata": {"dp_course_kind": "answer"}}]}
    start = time.process_time()
    secrets = redact.Secrets.of_notebook(graded)
    assert time.process_time() - start < 0.5
    assert secrets.guard("it said import torch as _probe_torch") == redact.WITHHELD
    assert secrets.guard(answer[:100]) == answer[:100]
    # A cell's output (up to 1,000,000 characters each) is looked at window by window: 200,000 letters made a set of
    # 21 MiB (130 MiB for 1,000,000), now only copies of the text (2.4 MiB).
    tracemalloc.start()
    assert secrets.guard(answer[:200_000]) == answer[:200_000]
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 5 * 2**20, f"{peak / 2**20:.1f} MiB"  # copies of the text itself
