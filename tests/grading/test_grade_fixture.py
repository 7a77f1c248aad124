"""The grader on a class of honest, clumsy and hostile submissions of a small lab (97), graded once."""
import ast
import contextlib
import csv
import datetime
import glob
import io
import json
import os
import pathlib
import re
import shutil
import time

import nbformat
import pytest

from helpers.grading import grade as grading
from helpers.grading import state as run_state
from helpers.grading.judge.redact import REACHES, WITHHELD
from helpers.grading.prepare import submissions
from helpers.grading.prepare.assemble import question_seed
from helpers.grading.report.gradebook import AFTER_RUN
from helpers.grading.report.report import load_results
from helpers.grading.run.cgroup import PREFIX, memory_root, pids_root
from helpers.grading.run.grade_student import MEMORY_LIMIT, Task
from helpers.grading.run.sandbox import Fences, available_fences
from tests.grading import fixture_lab as lab
from tests.grading import hostile

pytestmark = pytest.mark.timeout(600)

CORRECT_ADD = lab.ADD
CORRECT_SUM = lab.RANK_SUM
WRONG_SUM = "from helpers import launch\ndef rank_sum(world_size):\n    return 0.0\n"
CANARY = "canary-private-setup-3b9d"
INPUT_CANARY = 48611


def _replace_check(nb):
    nb.cells[3].source = "print('all checks passed: score 100')"


def _helper_cell(nb):
    nb.cells.insert(2, nbformat.v4.new_code_cell("def _plus(a, b):\n    return a + b\n"))


SUBMISSIONS = {
    # student: (add cell, rank_sum cell, other edit, expected 97.1, expected 97.2, expected status)
    "correct": (CORRECT_ADD, CORRECT_SUM, None, 2, 2, "ok"),
    "partly": (CORRECT_ADD, WRONG_SUM, None, 2, 0, "ok"),
    "syntax_error": ("def add(a, b:\n    return a + b\n", CORRECT_SUM, None, 0, 2, "error"),
    "infinite_loop": ("def add(a, b):\n    return a + b\nwhile True:\n    pass\n", CORRECT_SUM, None, 2, 2, "timeout"),
    # Rank 1 returns while rank 0 waits in a barrier it never joins: launch reports the deadlock at once.
    "deadlock_in_ranks": (CORRECT_ADD, "%%ranks 2 --hang-timeout 600\nimport torch.distributed as dist\n"
                          "if dist.get_rank() == 0:\n    dist.barrier()\n", None, 2, 0, "error"),
    "os_exit": (CORRECT_ADD, "import os\nos._exit(1)\n", None, 2, 0, "dead_kernel"),
    "memory_bomb": (CORRECT_ADD + "hog = bytearray(64 * 2**30)\n", CORRECT_SUM, None, 2, 2, "error"),
    # Its 97.2 cell also prints the kernel's history (In), 97.1's probe cell with it: OUT/return must not show it.
    "fake_score": ("print('score 100')\ndef add(a, b):\n    return a - b\n", WRONG_SUM + "print(In)\n", None, 0, 0,
                   "ok"),
    "monkeypatch": ("import torch, helpers.grading, helpers.grading.judge.plain\n"
                    "torch.allclose = lambda *a, **k: True\ntorch.equal = lambda *a, **k: True\n"
                    "helpers.grading.check = lambda *a, **k: None\n"
                    "helpers.grading.judge.plain.compare = lambda *a, **k: (True, '')\n"
                    "def add(a, b):\n    return a * 0\n", WRONG_SUM, None, 0, 0, "ok"),
    # These two hand in one 97.2 answer, renamed and reformatted: the similarity report's one pair.
    "edits_check_cell": (CORRECT_ADD, lab.GATHER_SUM, _replace_check, 2, 2, "ok"),
    "not_started": (None, None, None, 0, 0, "ok"),
    # Passes in the student's notebook; graded, the helper's cell is the lab's, so _plus is undefined.
    "helper_outside": ("def add(a, b):\n    return _plus(a, b)\n", lab.GATHER_SUM_COPIED, _helper_cell, 0, 2, "ok"),
}


# The hostile class needs the sandbox (and the fork bomb the task limit) to be graded fairly: without them the
# grader says which fences are missing (test_missing_fences_are_named) and these students are left out.
FENCES = available_fences()
HOSTILE = {s: v for s, v in hostile.HOSTILE.items() if FENCES.sandbox and (s != "fork_bomb" or FENCES.pids)}
CLASS = {**SUBMISSIONS, **HOSTILE}
needs_sandbox = pytest.mark.skipif(not FENCES.sandbox,
                                   reason="no bubblewrap sandbox here: " + "; ".join(FENCES.missing()))


# A hung cell holds its student for its whole limit (infinite_loop burns a core meanwhile; ignores_sigint sleeps
# through the grace too), so the limit is as low as the class's slowest honest cell allows, with 2.5x to spare:
# deadlock_in_ranks' launch reporting its deadlock (1.8 s on the 2-core machine at load 17), the 3-rank probe
# (0.7 s), the huge output (0.6 s). No cell waits for the forkserver's torch import (helpers.launcher.kernel starts
# it with the kernel).
HUNG_CELL_S = 5.0
# An honest kernel idles at 15 tasks and peaks at 30-40 in the 3-rank probe (pids.current of its cgroup). The fork
# bomb's copies of a torch kernel fork slowly (~10 a second at load 10-17, gVisor), so it took 14 s to reach 256,
# on a loaded machine after the limit + grace (15 s): "timeout" instead of the task limit's "error". 64 it
# reaches in 4-5 s.
MAX_TASKS = 64
# After the interrupt, before the kill: the bomb must meet the task limit within HUNG_CELL_S + GRACE_S, and the
# infinite loop take its interrupt. ignores_sigint waits out the grace too: 3 s more than the grader's default buys
# the bomb a 2.5x margin.
GRACE_S = 8.0


# The late policy (DEADLINE=...): every submission's file time is an hour before the deadline but partly's, 14 h late
# (-10 %: 2 -> 1.8 of 4), and edits_check_cell's, in 2099 (after the grading run: flagged, not charged).
DEADLINE = "2026-11-20T23:59:00+00:00"
OPTIONS = grading.Options(format="canvas", assignment="Lab 97 (1234)", deadline=DEADLINE)
TIMES = {"partly": "2026-11-21T13:59:00+00:00", "edits_check_cell": "2099-01-01T00:00:00+00:00"}


def _time_stamps(folder):
    for path in folder.glob("*.ipynb"):
        if path.is_file() and not path.is_symlink():
            stamp = datetime.datetime.fromisoformat(TIMES.get(path.stem, "2026-11-20T22:59:00+00:00")).timestamp()
            os.utime(path, (stamp, stamp))


def fixture_limits(hidden):
    """The fixture class's limits: every fence, low time and task limits (above), 3 GiB."""
    limits = grading.default_limits(hidden)
    limits.cell_seconds, limits.total_seconds, limits.memory_bytes = HUNG_CELL_S, 90.0, 3 * 2**30
    limits.grace_seconds, limits.max_tasks = GRACE_S, MAX_TASKS
    return limits


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    root = tmp_path_factory.mktemp("lab97")
    lab.build(root)
    probes = root / "probes" / "lab97.py"  # a private PROBES= file: its setup must never reach a student
    # ... nor a probe's inputs: "adds integers" adds a canary and the question's secret seed.
    text = probes.read_text().replace('SETUP = "', f'SETUP = "_probe_canary = {CANARY!r}; ')
    probes.write_text(text.replace("_probe_torch.tensor([2, 3])", f"_probe_torch.tensor([{INPUT_CANARY}, "
                                   "_PROBE_SEED])"))
    for student, (add, rank_sum, edit, *_rest) in CLASS.items():
        lab.submission(root, student, add, rank_sum, edit)
    (root / "submissions" / "garbage.ipynb").write_text("{ not a notebook")
    # Entries that are not a student's file (tests/grading/test_submissions.py has each kind): the solution scored
    # full marks through the symlink; the FIFO held that student for the hard limit, then the similarity report
    # for ever.
    (root / "submissions" / "sol_link.ipynb").symlink_to(next((root / "solutions").glob("97_*.ipynb")))
    os.mkfifo(root / "submissions" / "fifo.ipynb")
    _time_stamps(root / "submissions")
    out = root / "out"
    limits = fixture_limits([root / "probes", root / "solutions", root / "submissions", out])
    start = time.monotonic()
    progress = io.StringIO()  # the progress bar (tqdm, on sys.stderr), for test_progress_and_quiet_logs
    with contextlib.redirect_stderr(progress):
        results = grading.grade("97", root / "submissions", out, probes_dir=root / "probes", jobs=2, limits=limits,
                                labs_dir=root / "labs", solutions_dir=root / "solutions", options=OPTIONS)
    seconds = time.monotonic() - start
    (root / "grader_stderr.txt").write_text(progress.getvalue())
    with open(out / "grades.csv") as f:
        rows = {row["student"]: row for row in csv.DictReader(f)}
    return root, out, rows, results, seconds


@pytest.mark.parametrize("student", sorted(CLASS))
def test_each_submission_graded_as_it_deserves(graded, student):
    _, _, rows, _, _ = graded
    *_, q1, q2, status = CLASS[student]
    row = rows[student]
    assert (float(row["97.1"]), float(row["97.2"]), row["status"]) == (q1, q2, status), row
    assert row["max"] == "4" and float(row["total"]) == q1 + q2


def test_progress_and_quiet_logs(graded):
    # The instructor sees students done / total; the kernels' logs hold no c10d "hostname of the client socket"
    # warning (one per rank before the sandbox had an /etc/hosts: helpers/grading/run/sandbox.py).
    root, out, rows, _, _ = graded
    shown = (root / "grader_stderr.txt").read_text()
    graded_ones = len(rows) - len(NOT_REGULAR)  # refused without a grading process
    assert re.search(rf"grading: 100%.*\b{graded_ones}/{graded_ones}\b", shown), shown[-2000:]
    logs = {p.name: p.read_text(errors="replace") for p in (out / "logs").glob("*.log")}
    assert logs and len(logs) >= len(CLASS) - 1, sorted(logs)  # not_started never starts a kernel
    noisy = [name for name, text in logs.items() if "hostname of the client socket" in text]
    assert not noisy, f"c10d warnings in {noisy}"


def test_unreadable_notebook_is_an_error_row(graded):
    _, out, rows, _, _ = graded
    assert rows["garbage"]["status"] == "error" and rows["garbage"]["total"] == "0"
    assert "could not be read" in (out / "feedback" / "garbage.md").read_text()


NOT_REGULAR = ("sol_link", "fifo")


@pytest.mark.parametrize("student", NOT_REGULAR)
def test_a_symlink_or_a_fifo_is_an_error_row(graded, student):
    _, out, rows, _, seconds = graded
    assert (rows[student]["status"], rows[student]["total"]) == ("error", "0"), rows[student]
    assert submissions.NOT_REGULAR in (out / "feedback" / f"{student}.md").read_text()
    assert f"- {student}: {submissions.NOT_REGULAR}" in (out / "similarity.md").read_text()


def test_similarity_report_names_the_copying_pair_and_no_honest_one(graded):
    # Most of the class hands in the solution's 97.2 word for word: common, so it pairs no one, and each is listed
    # as a copy of the published solution; every 97.1 but the hostile ones is too short to compare.
    _, out, _, _, _ = graded
    with open(out / "similarity.csv") as f:
        rows = list(csv.DictReader(f))
    alike = [(row["question"], row["student_a"], row["student_b"]) for row in rows if row["kind"] == "alike"]
    assert alike == [("97.2", "edits_check_cell", "helper_outside")]
    pasted = {s for s, (_, rank_sum, *_rest) in CLASS.items() if rank_sum == CORRECT_SUM}
    assert {row["student_a"] for row in rows if row["kind"] == "solution"} == pasted
    text = (out / "similarity.md").read_text()
    assert "not a verdict" in text and "- garbage: not a readable notebook" in text
    assert "| 97.2 | correct | 1.00 | yes | " in text.split("## Copies of the published solution")[1]


def test_feedback_names_probes_but_never_their_source_or_values(graded):
    _, out, _, _, _ = graded
    text = (out / "feedback" / "partly.md").read_text()
    assert "three ranks: failed: wrong value" in text and "adds two vectors: passed" in text
    assert "rank_sum(3)" not in text and "_probe_torch" not in text and "3.0" not in text


def test_what_goes_back_to_a_student_holds_no_hidden_test(graded):
    # The executed notebooks are the instructor's: fake_score's printed the probe cell, private setup and all.
    _, out, rows, _, _ = graded
    assert CANARY in _outputs(out, "fake_score")
    assert sorted(p.name for p in (out / "return").iterdir()) == sorted(rows)
    for path in (out / "return").rglob("*"):
        text = path.read_text(errors="replace") if path.is_file() else ""
        # The canary, a probe cell's first line and a probe's expression (the students' own code may name more)
        assert CANARY not in text and "import run_probes as" not in text and "rank_sum(3)" not in text, path
    folder = out / "return" / "correct"
    assert (folder / "feedback.md").read_text() == (out / "feedback" / "correct.md").read_text()
    back = nbformat.read(folder / "97_fixture.ipynb", as_version=4)
    assert [c.source for c in back.cells if c.metadata.get("dp_course", {}).get("answers")] == [CORRECT_ADD,
                                                                                                 CORRECT_SUM]
    assert sorted(p.name for p in (out / "return" / "garbage").iterdir()) == ["feedback.md"]  # never run


def test_edited_check_cell_is_replaced_by_the_released_one(graded):
    _, out, _, _, _ = graded
    executed = nbformat.read(out / "executed" / "edits_check_cell.ipynb", as_version=4)
    assert 'check("97.1", globals())' in [c.source for c in executed.cells]
    assert "score 100" not in str(executed.cells)


def test_cell_log_and_columns(graded):
    _, out, _, _, _ = graded
    with open(out / "grades.csv") as f:
        assert next(csv.reader(f)) == ["student", "97.1", "97.2", "total", "max", "status", "seconds", "submitted",
                                       "late_days", "penalty", "final", "time_note"]
    with open(out / "cells.csv") as f:
        log = list(csv.DictReader(f))
    assert {"ok", "timeout"} <= {row["status"] for row in log if row["student"] == "infinite_loop"}


def test_class_time_is_bounded_by_the_hung_cells(graded):
    # A hung cell costs its limit + the grace + a new kernel (about a student); the rest of a class costs a student
    # each (a kernel importing torch, ranks): about 7 s, or what a one-kernel student without a hung cell took in
    # this very run if more (a loaded machine slows every kernel start, 17 s at load 15, hung or not). Two at a time,
    # plus the solution's run, with 2x to spare; and each hung student within 2x of its own share.
    _, _, _, results, seconds = graded
    hung = {r["student"]: sum(c["status"] == "timeout" for c in r["cells"]) for r in results}
    plain = sorted(r["seconds"] for r in results if not hung[r["student"]] and r["kernels"] == 1)
    student = max(7.0, plain[len(plain) // 2])
    per_hung = HUNG_CELL_S + GRACE_S + student
    slow = {r["student"]: r["seconds"] for r in results
            if hung[r["student"]] and r["seconds"] > 2.0 * (student + hung[r["student"]] * per_hung)}
    assert not slow, f"hung students took more than 2x a student + their hung cells ({student:.0f} s): {slow}"
    budget = 2.0 * (student + (len(results) * student + sum(hung.values()) * per_hung) / 2)
    assert seconds < budget, (f"graded {len(results)} submissions with {sum(hung.values())} hung cells in "
                              f"{seconds:.0f} s, over {budget:.0f} s (a student: {student:.0f} s)")


def _outputs(out, student):
    return str([c.get("outputs") for c in nbformat.read(out / "executed" / f"{student}.ipynb", as_version=4).cells])


@needs_sandbox
def test_no_process_outlives_grading(graded):
    leftovers = []
    for cmdline in glob.glob("/proc/[0-9]*/cmdline"):
        try:
            text = pathlib.Path(cmdline).read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if hostile.MARKER in text and "pytest" not in text:
            leftovers.append((cmdline, text))
    assert not leftovers


@needs_sandbox
def test_the_solution_is_out_of_reach(graded):
    _, out, _, _, _ = graded
    assert "NOTHING []" in _outputs(out, "finds_solution")


@needs_sandbox
def test_the_solution_search_works_outside_the_sandbox(graded, tmp_path):
    # The attack is real: run without the sandbox, the same code finds the solution and the repository's history.
    root, _, _, _, _ = graded
    work = root / "elsewhere" / "work"
    work.mkdir(parents=True)
    # In this process, not a new interpreter: `import helpers` imports torch, 3 CPU-s more.
    printed = io.StringIO()
    with contextlib.chdir(work), contextlib.redirect_stdout(printed):
        exec(hostile.FIND_SOLUTION, {"__name__": "find_solution"})  # the attack, run on purpose
    assert printed.getvalue().startswith("FOUND") and "97_fixture.ipynb" in printed.getvalue(), printed.getvalue()


@needs_sandbox
def test_nothing_written_outside_its_own_directory(graded):
    root, out, _, _, _ = graded
    wrote = _outputs(out, "writes_everywhere")
    # It may write in the sandbox's tmpfs (/tmp, its working directory, TMPDIR) and in the directory of its
    # kernel's sockets, nowhere else: not in the directory that holds them on the grader's disk.
    dirs = ast.literal_eval(re.search(r"WROTE (\[.*?\])\\n", wrote)[1])
    workdir = re.search(r"'(/tmp/grade-\w+)/work'", wrote)[1]
    writable = [f"{workdir}/work", f"{workdir}/kernel/tmp", f"{workdir}/kernel/runtime"]

    def allowed(d):
        under = [p for p in writable + ["/tmp"] if os.path.commonpath([d, p]) == p]
        return under and (under != ["/tmp"] or os.path.commonpath([d, workdir]) != workdir)

    assert dirs and [d for d in dirs if not allowed(d)] == [], wrote
    stray = glob.glob(f"/tmp/**/{hostile.MARKER}-pwned", recursive=True) + \
        glob.glob(str(pathlib.Path(grading.ROOT) / f"**/{hostile.MARKER}-pwned"), recursive=True)
    assert not stray


@needs_sandbox
def test_proc_shows_only_the_sandbox(graded):
    root, out, _, _, _ = graded
    seen = _outputs(out, "reads_proc_kills_grader")
    assert "pytest" not in seen and "grade_student" not in seen and str(root) not in seen


@needs_sandbox
def test_huge_output_is_cut(graded):
    _, out, _, _, _ = graded
    assert os.path.getsize(out / "executed" / "huge_output.ipynb") < 3_000_000
    assert "output beyond 1,000,000 characters dropped" in _outputs(out, "huge_output")


@needs_sandbox
def test_a_hung_question_costs_only_that_question(graded):
    _, out, _, results, _ = graded
    result = next(r for r in results if r["student"] == "ignores_sigint")
    assert result["kernels"] == 2
    assert "ignored the interrupt, so its kernel was killed" in _outputs(out, "ignores_sigint")
    assert "needed 2 kernels" in (out / "feedback" / "ignores_sigint.md").read_text()


def test_a_syntax_error_is_quoted_first(graded):
    # Not the NameError its probes met: the student's own SyntaxError, with its line, in the status line and first
    # under its question.
    _, out, _, _, _ = graded
    lines = (out / "feedback" / "syntax_error.md").read_text().splitlines()
    quoted = "raised `SyntaxError: '(' was never closed` at line 1: `def add(a, b:`"
    assert lines[2] == f"Score: 2 / 4. Status: error (your answer cell for 97.1 {quoted}).", lines
    section = lines[lines.index("## Question 97.1: 0 / 2") + 1:]
    assert section[0] == f"- your answer cell {quoted}: fix this first, the failures below may follow from it"
    assert "NameError" in section[1], section


def test_the_late_student_scores_the_same_everywhere(graded):
    # grades.csv, results/<student>.json, the feedback and the Canvas file agree on the points after the penalty.
    _, out, rows, _, _ = graded
    partly = rows["partly"]
    assert (partly["total"], partly["late_days"], partly["penalty"], partly["final"]) == ("2", "1", "0.1", "1.8")
    saved = json.loads((out / "results" / "partly.json").read_text())
    assert (saved["submitted"], saved["penalty"], saved["final"]) == ("2026-11-21T13:59:00+00:00", 0.1, 1.8)
    assert "Submitted 14 h late: -10 %, 1.8 / 4." in (out / "feedback" / "partly.md").read_text()
    with open(out / "gradebook-canvas.csv") as f:
        canvas = {row["SIS User ID"]: row["Lab 97 (1234)"] for row in csv.DictReader(f)}
    assert canvas["partly"] == "1.8" and canvas == {s: row["final"] for s, row in rows.items()}
    assert [s for s, row in rows.items() if row["final"] != row["total"]] == ["partly"]


def test_a_time_after_the_grading_run_is_flagged(graded):
    _, out, rows, _, _ = graded
    row = rows["edits_check_cell"]
    assert (row["submitted"], row["penalty"], row["final"], row["time_note"]) == (
        "2099-01-01T00:00:00+00:00", "0", "4", AFTER_RUN), row
    assert f"Submission time (2099-01-01T00:00:00+00:00): {AFTER_RUN}; 4 / 4." in (
        out / "feedback" / "edits_check_cell.md").read_text()


def test_an_out_holding_a_run_is_refused_and_left_as_it_was(graded, capsys):
    root, out, _, _, _ = graded
    before = {p: p.stat().st_mtime_ns for p in out.rglob("*")}
    args = ["--lab", "97", "--submissions", str(root / "submissions"), "--out", str(out), "--probes",
            str(root / "probes"), "--solutions", str(root / "solutions"), "--labs", str(root / "labs")]
    assert grading.main(args) == 2
    said = capsys.readouterr().err.strip().splitlines()[-1]
    assert said == (f"grade: OUT={out} holds an earlier grading run (lab 97, SUBMISSIONS={root / 'submissions'}, "
                    f"{len(list((out / 'results').glob('*.json')))} result(s)): pass RESUME=1 (--resume) to finish it, "
                    "ONLY=ids (--only) to re-grade some students, FRESH=1 (--fresh) to delete it and grade anew, or "
                    "another OUT"), said
    other = root / "another_class"
    other.mkdir()
    shutil.copy2(root / "submissions" / "correct.ipynb", other / "frank.ipynb")
    assert grading.main([*args[:2], "--submissions", str(other), *args[4:], "--only", "frank"]) == 2
    said = capsys.readouterr().err.strip().splitlines()[-1]
    assert said.startswith(f"grade: OUT={out} holds the run of SUBMISSIONS={root / 'submissions'}, not {other}: "
                           "grading another folder into it would mix two classes"), said
    assert {p: p.stat().st_mtime_ns for p in out.rglob("*")} == before, "a refused run changed OUT"
    (root / "notes").mkdir()
    (root / "notes" / "todo.txt").write_text("mine")
    with pytest.raises(run_state.StateError, match="is not empty .todo.txt. and holds no grading run"):
        grading.grade("97", other, root / "notes", probes_dir=root / "probes", labs_dir=root / "labs",
                      solutions_dir=root / "solutions")


def test_fresh_deletes_the_earlier_run(graded, monkeypatch, capsys):
    # A copy of the class's OUT graded afresh from a folder of one unreadable notebook (no kernel): the solution's
    # values are the class run's (its own run is tested with the class), nothing of the earlier run stays.
    root, out, _, _, _ = graded
    fresh = root / "fresh_out"
    shutil.copytree(out, fresh)
    state = json.loads((fresh / "state.json").read_text())
    monkeypatch.setattr(grading, "expected_values", lambda *args, **kwargs: state["expected"])
    one = root / "one"
    one.mkdir()
    shutil.copy2(root / "submissions" / "garbage.ipynb", one)
    begun = time.time_ns()
    assert grading.main(["--lab", "97", "--submissions", str(one), "--out", str(fresh), "--probes",
                         str(root / "probes"), "--solutions", str(root / "solutions"), "--labs", str(root / "labs"),
                         "--fresh"]) == 0
    assert capsys.readouterr().out.startswith(f"graded 1 submission into {fresh}/grades.csv (1 student)")
    files = [p for p in fresh.rglob("*") if p.is_file()]
    assert files and all(p.stat().st_mtime_ns >= begun for p in files), [p for p in files
                                                                         if p.stat().st_mtime_ns < begun]
    assert sorted(p.name for p in (fresh / "results").iterdir()) == ["garbage.json"]
    assert not (fresh / "gradebook-canvas.csv").exists(), "FRESH=1 keeps none of the earlier run's options"
    assert json.loads((fresh / "state.json").read_text())["seed"] != state["seed"]


def test_missing_fences_are_named():
    gaps = Fences(sandbox=False, drop_user=False, memory=False, pids=False).missing()
    assert any("bubblewrap" in g for g in gaps) and any("prlimit" in g for g in gaps)
    assert any("fork bomb" in g for g in gaps) and any("no memory cgroup" in g for g in gaps)


def test_a_helper_outside_the_answer_cells_is_named_in_the_feedback(graded):
    _, out, _, _, _ = graded
    text = (out / "feedback" / "helper_outside.md").read_text()
    assert "your answer uses `_plus`, defined in a cell of your own: only answer cells are graded" in text


@pytest.fixture(scope="module")
def two_students(graded):
    """A copy of the class's OUT for two of its students (and the unreadable notebook), to resume and re-grade
    without grading anew."""
    root, out, _, _, _ = graded
    subs, out2 = root / "two", root / "out2"
    subs.mkdir()
    for sub in ("results", "executed", "feedback", "logs"):
        (out2 / sub).mkdir(parents=True)
    state = json.loads((out / "state.json").read_text())
    (out2 / "state.json").write_text(json.dumps({**state, "submissions": str(subs.resolve())}))
    for student in ("correct", "partly", "garbage"):
        shutil.copy2(root / "submissions" / f"{student}.ipynb", subs)
        shutil.copy(out / "results" / f"{student}.json", out2 / "results")
    return root, subs, out2


def _rows(out):
    with open(out / "grades.csv") as f:
        return {row["student"]: row for row in csv.DictReader(f)}


def test_resume_grades_only_missing_and_failed_students(two_students):
    root, subs, out = two_students
    seed = json.loads((out / "state.json").read_text())["seed"]
    (out / "results" / "partly.json").unlink()
    result = json.loads((out / "results" / "correct.json").read_text())
    (out / "results" / "correct.json").write_text(json.dumps({**result, "status": "grader_error"}))
    shutil.copy(subs / "correct.ipynb", subs / "kept.ipynb")
    (out / "results" / "kept.json").write_text(json.dumps({**result, "student": "kept", "seconds": 123.0}))
    assert grading.main(["--lab", "97", "--submissions", str(subs), "--out", str(out), "--resume",
                         "--probes", str(root / "probes"), "--solutions", str(root / "solutions"),
                         "--labs", str(root / "labs")]) == 0
    rows = _rows(out)
    assert [(rows[s]["total"], rows[s]["status"]) for s in ("correct", "partly")] == [("4", "ok"), ("2", "ok")]
    assert rows["kept"]["seconds"] == "123.0", "a trusted result must not be graded again"
    assert json.loads((out / "state.json").read_text())["seed"] == seed


def test_only_regrades_the_named_student(two_students, capsys):
    # The named student is the unreadable notebook: its grading starts no kernel (~5 CPU-s for partly's).
    root, subs, out = two_students
    before = json.loads((out / "results" / "correct.json").read_text())["seconds"]
    garbage = json.loads((out / "results" / "garbage.json").read_text())
    (out / "results" / "garbage.json").write_text(json.dumps({**garbage, "seconds": 99.0}))
    assert grading.main(["--lab", "97", "--submissions", str(subs), "--out", str(out), "--probes",
                         str(root / "probes"), "--solutions", str(root / "solutions"), "--labs", str(root / "labs"),
                         "--only", "garbage"]) == 0
    said = capsys.readouterr().out
    assert re.match(rf"graded 1 submission \(\d+ kept from the earlier run\) into {re.escape(str(out))}/grades.csv",
                    said), said
    assert f"wrote {out}/gradebook-canvas.csv" in said, "the run's own options, though none was given"
    assert json.loads((out / "results" / "correct.json").read_text())["seconds"] == before
    assert json.loads((out / "results" / "garbage.json").read_text())["seconds"] != 99.0, "the named one is graded"
    options = dict(probes_dir=root / "probes", labs_dir=root / "labs", solutions_dir=root / "solutions")
    with pytest.raises(grading.GradingError, match="--only nobody: no such submission; students: correct, "):
        grading.grade("97", subs, out, only=["nobody"], **options)


def test_resume_needs_the_same_run(two_students, tmp_path):
    _, _, out = two_students
    with pytest.raises(run_state.StateError, match="holds no earlier grading run to continue"):
        run_state.load_or_start(tmp_path, "97", "abc", fresh=False)
    with pytest.raises(run_state.StateError, match="changed since"):
        run_state.load_or_start(out, "97", "another fingerprint", fresh=False)


def _dead_graders_cgroups(root=None):
    """pids cgroups (or those under root) of grading processes that are gone: what a killed grader left behind."""
    root = root or pids_root()
    names = [n for n in os.listdir(root) if n.startswith(PREFIX)] if root else []
    return {n for n in names if not os.path.exists(f"/proc/{n[len(PREFIX):].split('-')[0]}")}


def test_an_overdue_student_is_a_grader_error_and_the_class_goes_on(two_students):
    root, subs, out = two_students
    left_before = _dead_graders_cgroups()
    state = json.loads((out / "state.json").read_text())
    released = nbformat.read(root / "labs" / "97_fixture.ipynb", as_version=4)
    task = Task("97", released, str(root / "probes"), state["expected"], state["seed"], str(out),
                grading.default_limits([root / "probes", root / "solutions", subs, out]))
    grading.run_class(task, [("partly", str(subs / "partly.ipynb"))], jobs=1, hard_limit=0.5)
    [result] = load_results(out, ["partly"])
    assert result["status"] == "grader_error"
    assert "grading took longer than 0 s and was stopped" in result["error"]
    assert "partly: grading took longer" in (out / "logs" / "grader.log").read_text()
    assert _dead_graders_cgroups() <= left_before, "the killed student's kernel cgroup was left behind"


# Issue 29: an answer displayed 435 MiB (in the probes' own MIME type, past the output cap); its student's grading
# process, which receives every message whole before any cap can cut it, grew to 2 GiB with no limit. A message costs
# it about 3 times its size (a 100 MiB display: 316 MiB more, 150 MiB: 467, a 1 MiB one 18; measured in its memory
# cgroup without a limit). Here 100 MiB under a limit of 64 MiB more than the grading process holds when it starts.
MEMORY_HOG = CORRECT_ADD + "from IPython.display import display\ndisplay({'text/plain': 'x' * 100 * 2**20}, raw=True)\n"


@pytest.mark.skipif(not FENCES.memory_cgroups, reason="no writable memory cgroup here: test_memory_limit.py tests "
                    "the fallback (RLIMIT_AS)")
def test_a_grading_process_past_its_memory_limit_is_that_students_memory_limit(graded):
    root, out, _, _, _ = graded
    subs, out4 = root / "hog", root / "out_memory"
    subs.mkdir()
    for sub in ("results", "executed", "feedback", "logs"):
        (out4 / sub).mkdir(parents=True)
    lab.submission(root, "hog", MEMORY_HOG, CORRECT_SUM)
    shutil.move(root / "submissions" / "hog.ipynb", subs / "hog.ipynb")
    state = json.loads((out / "state.json").read_text())
    released = nbformat.read(root / "labs" / "97_fixture.ipynb", as_version=4)
    limits = fixture_limits([root / "probes", root / "solutions", subs, out4])
    limits.cell_seconds, limits.grader_memory_bytes = 60.0, 64 * 2**20  # building 300 MiB took 7 s at load 11
    task = Task("97", released, str(root / "probes"), state["expected"], state["seed"], str(out4), limits)
    left_before = _dead_graders_cgroups(memory_root())
    grading.run_class(task, [("hog", str(subs / "hog.ipynb"))], jobs=1, hard_limit=300)
    [result] = load_results(out4, ["hog"])
    assert (result["status"], result["error"]) == ("memory_limit", MEMORY_LIMIT.format(64)), result
    assert f"hog: {MEMORY_LIMIT.format(64)}" in (out4 / "logs" / "grader.log").read_text()
    assert _dead_graders_cgroups(memory_root()) <= left_before, "the student's memory cgroups were left behind"


@needs_sandbox
def test_the_sandbox_tmpfs_is_capped_and_a_forged_probe_result_counts_for_nothing(graded):
    _, out, _, _, _ = graded
    shown = _outputs(out, "fills_tmpfs_forges_probe")
    work = re.search(r"(/tmp/grade-\w+)/work REFUSED", shown)
    assert work, shown[:2000]
    for place in ("/tmp", "/dev/shm", work[1] + "/work", work[1] + "/kernel/tmp"):
        assert f"{place} REFUSED No space left on device" in shown, (place, shown[:2000])
    feedback = (out / "feedback" / "fills_tmpfs_forges_probe.md").read_text()
    # What it displayed is not read (the probes' values come by the grader's pipe); its `In` is refused.
    assert "three ranks: failed: uses `In`, which hides what the answer runs" in feedback, feedback


def _secrets_of_the_run(out):
    """What no file a student gets may hold: the private setup's canary, a probe's input canary, the run's seed and
    each question's, every probe cell's nonce and first line."""
    state = json.loads((out / "state.json").read_text())
    seeds = {state["seed"], *(json.loads(p.read_text()).get("probe_seed", state["seed"])
                              for p in (out / "results").glob("*.json"))}
    found = {CANARY, str(INPUT_CANARY), "import run_probes as", *map(str, seeds)}
    found |= {str(question_seed(seed, q)) for seed in seeds for q in ("97.1", "97.2")}
    for path in (out / "executed").glob("*.ipynb"):
        for cell in nbformat.read(path, as_version=4).cells:
            if cell.metadata.get("dp_course_kind") == "probe":
                found |= set(re.findall(r"'([0-9a-f]{16})'", cell.source))
    return found


def test_no_probe_text_or_input_reaches_a_student(graded):
    # leaks_probe_and_inputs printed and raised the probe cell, its frames' locals and its inputs (the executed
    # notebook, the instructor's, shows them): the feedback quotes its errors without them, and what goes back holds
    # none of them, nor does any reason the grader keeps (results, grades.csv, cells.csv).
    _, out, rows, _, _ = graded
    shown = _outputs(out, "leaks_probe_and_inputs")
    assert "canary-priva" in shown and str(INPUT_CANARY) in shown, "the attack did not reach what it leaks"
    secrets = _secrets_of_the_run(out)
    files = [p for p in [*(out / "feedback").rglob("*"), *(out / "return").rglob("*"), out / "grades.csv",
                         out / "cells.csv"] if p.is_file()]
    texts = {str(p.relative_to(out)): p.read_text(errors="replace") for p in files}
    for path in (out / "results").glob("*.json"):  # the reasons it keeps (it also records the student's seed)
        result = json.loads(path.read_text())
        reasons = [m["message"] for marks in result["marks"].values() for m in marks] + [
            str(row.get(k)) for row in result.get("cell_errors") or [] for k in ("error", "text")]
        texts[str(path.relative_to(out))] = "\n".join([*reasons, str(result.get("error")),
                                                       str(result.get("composition"))])
    leaked = {(name, s) for name, text in texts.items() for s in secrets if s in text}
    assert not leaked, sorted(leaked)[:10]
    feedback = (out / "feedback" / "leaks_probe_and_inputs.md").read_text()
    # Inputs alone are masked, inputs holding the seed withheld; what answers reading `In` raise is not quoted.
    assert "adds two vectors: failed: `RuntimeError: inputs […, …, …, …] […, …, …, …]`" in feedback, feedback
    assert f"adds integers: failed: {WITHHELD}" in feedback and "three ranks: failed: uses `" in feedback, feedback
    assert f"Status: error (your answer cell for 97.2 did not run to its end ({REACHES} (uses `" in feedback, feedback


def test_a_replaced_submission_is_graded_on_fresh_inputs(two_students):
    # The attack: a first submission's feedback quoted 97.1's inputs (its seed); the student hands in a lookup table
    # computed at home for exactly those inputs, and the instructor re-grades it with ONLY=. Same inputs: 2/2 with no
    # implementation. The replaced bytes get inputs of their own: the table answers only the public probe.
    root, subs, out = two_students
    subs3, out3 = root / "replaced", root / "out3"
    shutil.copytree(subs, subs3)
    shutil.copytree(out, out3)
    state = json.loads((out3 / "state.json").read_text())
    (out3 / "state.json").write_text(json.dumps({**state, "submissions": str(subs3.resolve())}))
    leaked = question_seed(state["seed"], "97.1")
    table = (f"import torch\ndef add(a, b):\n    table = {{({INPUT_CANARY}, {leaked}, 5, 7): [{INPUT_CANARY + 5}, "
             f"{leaked + 7}], (0.0, 1.0, 2.0, 3.0, 1.0, 1.0, 1.0, 1.0): [1.0, 2.0, 3.0, 4.0]}}\n"
             "    return torch.tensor(table.get(tuple(a.tolist() + b.tolist()), [0] * len(a)), dtype=a.dtype)\n")
    lab.submission(root, "partly", table, WRONG_SUM)
    shutil.copy(root / "submissions" / "partly.ipynb", subs3 / "partly.ipynb")
    args = ["--lab", "97", "--submissions", str(subs3), "--out", str(out3), "--probes", str(root / "probes"),
            "--solutions", str(root / "solutions"), "--labs", str(root / "labs")]
    assert grading.main([*args, "--only", "partly"]) == 0
    assert _rows(out3)["partly"]["97.1"] == "1", "the lookup table scored the secret inputs it was computed for"
    # The same bytes would be graded on the same inputs: a seed drawn from the run's secret, the student and them.
    result = json.loads((out3 / "results" / "partly.json").read_text())
    sha256 = run_state.digest((subs3 / "partly.ipynb").read_bytes())
    assert result["sha256"] == sha256 and result["probe_seed"] != state["seed"]
    assert result["probe_seed"] == run_state.probe_seed(state["seed"], state["secret"], state["students"], "partly",
                                                        sha256)
    assert state["students"]["correct"] == run_state.digest((subs3 / "correct.ipynb").read_bytes())
