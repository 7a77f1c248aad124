"""Grade a class: `make grade LAB=03 SUBMISSIONS=dir OUT=dir [PROBES=dir]`.

    python -m helpers.grading.grade --lab 03 --submissions dir --out dir [--probes dir] [--jobs 2]
                                    [--resume] [--only STUDENT ...]

Writes OUT/grades.csv, OUT/feedback/<student>.md, OUT/executed/<student>.ipynb, OUT/cells.csv (every cell's
status and duration), OUT/results/<student>.json (what --resume trusts), OUT/logs/ (kernels' own output,
the grader's errors) and OUT/similarity.md and .csv (pairs of students whose answers are unusually alike:
helpers/grading/similarity.py). Only a regular file SUBMISSIONS/<student>.ipynb is read; a symlink, FIFO, device or
directory of that name is an `error` row and is never opened (helpers/grading/submissions.py). Exits 0 whatever the
students did; non-zero only when grading itself cannot run (no such lab, probes failing on the solution, an
unwritable OUT).

Each student is graded in a process of its own; one that dies or overruns is that student's `grader_error`,
and the class goes on. `--resume` keeps the results already in OUT and grades only the students without one
or with a `grader_error`; `--only` re-grades the named students. Both reuse the run's secret probe seed.
"""
import argparse
import dataclasses
import multiprocessing
import multiprocessing.connection
import os
import pathlib
import re
import sys
import time

import nbformat

from helpers.grading import cgroup, gradebook, reference, returns, similarity_report, submissions
from helpers.grading import probes as probe_files
from helpers.grading import state as run_state
from helpers.grading.execute import Limits
from helpers.grading.grade_student import (
    Task,
    grade_student,
    refused_result,
    result_path,
    run_one,
    write_result,
    zero_marks,
)
from helpers.grading.progress import Progress
from helpers.grading.report import load_results, write_lms, write_outputs
from helpers.grading.sandbox import available_fences, grading_runs
from helpers.launcher import forkserver

ROOT = pathlib.Path(__file__).resolve().parents[2]


class GradingError(RuntimeError):
    """Grading itself cannot run; the message says what to fix."""


def lab_notebook(directory, lab):
    """The one notebook NN_*.ipynb of lab NN in directory."""
    found = sorted(pathlib.Path(directory).glob(f"{lab}_*.ipynb"))
    if len(found) != 1:
        raise GradingError(f"expected one notebook {lab}_*.ipynb in {directory}, found {len(found)}")
    return found[0]


def expected_values(released, solution, setup, probes, seed, limits, references=None):
    """The solution's probe values for this seed; every probe must succeed on it."""
    import tempfile

    with tempfile.TemporaryDirectory(prefix="grade-solution-") as workdir:
        pathlib.Path(workdir).chmod(0o755)
        _, execution, values, missing = run_one(released, solution, setup, probes, seed, workdir, limits, references)
    failed = [p.name for p in probes if "value" not in values.get(p.question, {}).get(p.name, {})]
    if missing or failed:
        raise GradingError(f"the solution does not pass its own probes ({missing or failed}; status "
                           f"{execution.status}): fix the probes or the solution before grading")
    return values


# What makes a rank import torch._dynamo (DDP's constructor, an optimizer's step, FSDP, ZeRO).
_DYNAMO_USERS = re.compile(r"DistributedDataParallel|DDP\(|fully_shard|FullyShardedDataParallel|"
                           r"ZeroRedundancyOptimizer|torch\.optim|optim\.")


def ranks_need_dynamo(released, setup):
    """Whether the lab's code or its probes use what imports torch._dynamo; if not, the forkserver skips it."""
    code = "\n".join(c.source for c in released.cells if c.cell_type == "code") + setup
    return _DYNAMO_USERS.search(code) is not None


def student_limit(released, limits):
    """Wall-clock seconds after which a student's grading process is killed (the kernel limits, and margin)."""
    answers = sum(1 for c in released.cells if c.get("metadata", {}).get("dp_course", {}).get("answers"))
    return limits.total_seconds + (answers + 1) * (limits.cell_seconds + limits.grace_seconds + 60)


def _context():
    # A forkserver with the grading modules imported: each student's process is a cheap fork of it, yet
    # nothing of this process (threads, zmq sockets of the solution's run) leaks into it. Started before the
    # solution's run, it imports them (about 2.5 s) meanwhile.
    # This forkserver is the grader's, not a launcher's, if one runs (helpers.launcher.forkserver).
    forkserver.ensure_running(["helpers.grading.grade_student"])
    return multiprocessing.get_context("forkserver")


def run_class(task, students, jobs, hard_limit, ctx=None):
    """Grade (student, path) pairs, `jobs` at a time, each in its own process; returns nothing (results on disk)."""
    ctx, queue, running = ctx or _context(), list(students), {}
    with Progress(len(students)) as progress:
        try:
            while queue or running:
                while queue and len(running) < jobs:
                    student, path = queue.pop(0)
                    # Not a daemon: a judge may start processes of its own (10.3 runs torch DDP on the ranks).
                    process = ctx.Process(target=grade_student, args=(task, student, path))
                    process.start()
                    running[process.sentinel] = (process, student, time.monotonic())
                    progress.started(student)
                _reap(task, running, hard_limit, progress)
        finally:  # interrupted: no student's grading outlives the class's
            for process, _, _ in running.values():
                process.kill()
                process.join()
                cgroup.remove_left_by(process.pid)


def _reap(task, running, hard_limit, progress):
    """Wait up to 1 s; record every student whose process ended or overran."""
    ready = multiprocessing.connection.wait(list(running), timeout=1.0)
    for sentinel, (process, student, began) in list(running.items()):
        overdue = time.monotonic() - began > hard_limit
        if sentinel not in ready and not overdue:
            continue
        if overdue:
            process.kill()  # its kernels' sandboxes die with it (bwrap --die-with-parent)
        process.join()
        if overdue:
            cgroup.remove_left_by(process.pid)  # killed before its own cleanup could remove them
        del running[sentinel]
        _check_result(task, student, process.exitcode, overdue, hard_limit, time.monotonic() - began)
        progress.finished(student)


def _check_result(task, student, exitcode, overdue, hard_limit, seconds):
    """A grading process that left no result is a grader_error for that student, with the reason."""
    path = result_path(task.out, student)
    if exitcode == 0 and path.exists() and not overdue:
        return
    why = (f"grading took longer than {hard_limit:.0f} s and was stopped" if overdue
           else f"the grading process died (exit code {exitcode})")
    setup, probes = probe_files.load(task.lab, task.probes_dir)
    write_result(task.out, {"student": student, "status": "grader_error", "missing": [], "cells": [], "kernels": 0,
                            "marks": zero_marks(probes, why), "error": why, "seconds": round(seconds, 1)})
    with open(pathlib.Path(task.out) / "logs" / "grader.log", "a") as log:
        log.write(f"{student}: {why}\n")


def kernel_threads(jobs):
    """Intra-op threads per graded kernel: the cores shared by the kernels that run at once. With torch's
    default (every core) in each, 2 kernels on 2 cores spin-wait on each other: in make test's own kernels it
    cost 17% more CPU seconds (tests/test_mistakes.py -k "lab01 or lab06" + chapters 01, 06: 63-67 vs 51-57 s)."""
    return max(1, (os.cpu_count() or 1) // max(1, jobs))


def grade(lab, submissions_dir, out, *, probes_dir=None, jobs=2, limits=None, labs_dir=None, solutions_dir=None,
          resume=False, only=()):
    """Grade every *.ipynb in submissions_dir into out; return the per-student results (dicts)."""
    lab, out = f"{int(lab):02d}", pathlib.Path(out)
    released = nbformat.read(lab_notebook(labs_dir or ROOT / "labs", lab), as_version=4)
    solution_path = lab_notebook(solutions_dir or ROOT / "solutions", lab)
    setup, probes = probe_files.load(lab, probes_dir)
    limits = limits or default_limits([probes_dir or probe_files.DEFAULT_DIR, solutions_dir or ROOT / "solutions",
                                       submissions_dir, out])
    limits = dataclasses.replace(limits, preload_dynamo=ranks_need_dynamo(released, setup),
                                 threads=limits.threads or kernel_threads(jobs))
    for sub in ("executed", "feedback", "results", "logs"):
        (out / sub).mkdir(parents=True, exist_ok=True)
    probe_file = pathlib.Path(probes_dir or probe_files.DEFAULT_DIR) / f"lab{lab}.py"
    fingerprint = run_state.fingerprint(lab_notebook(labs_dir or ROOT / "labs", lab), solution_path, probe_file)
    state = run_state.load_or_start(out, lab, fingerprint, fresh=not (resume or only))
    ctx = _context()
    solution = nbformat.read(solution_path, as_version=4)
    # One mistake, one question: the earlier answers a question's probes call are the solution's (reference.py).
    references = reference.references(solution, probe_files.load_uses(lab, probes_dir))
    expected = state.get("expected")
    if expected is None:
        expected = expected_values(released, solution, setup, probes, state["seed"], limits, references)
        run_state.save(out, {**state, "expected": expected})
    task = Task(lab, released, str(probes_dir) if probes_dir else None, expected, state["seed"], str(out), limits,
                references)
    paths, refused = submissions.listing(submissions_dir)
    todo = _to_grade(out, {**paths, **refused}, resume, only)
    refuse(out, lab, probes_dir, {s: refused[s] for s, _ in todo if s in refused})
    run_class(task, [(s, p) for s, p in todo if s in paths], jobs, student_limit(released, limits), ctx)
    results = load_results(out, sorted({**paths, **refused}))
    write_outputs(out, probes, results, probe_files.load_manual(lab, probes_dir))
    returns.write_all(out, results, lab_notebook(labs_dir or ROOT / "labs", lab).name)  # OUT/return/<student>/
    _write_similarity(out, lab, released, {**paths, **refused_paths(submissions_dir, refused)}, solution)
    return results


def refuse(out, lab, probes_dir, refused):
    """An `error` result for each entry of SUBMISSIONS that is not a regular file {student: why}: none is opened."""
    probes = probe_files.load(lab, probes_dir)[1]
    for student, why in refused.items():
        write_result(out, {**refused_result(student, probes, why), "seconds": 0.0})


def refused_paths(directory, refused):
    """{student: path} of the refused entries: the similarity report lists them as not read, without opening one."""
    return {student: str(pathlib.Path(directory) / f"{student}.ipynb") for student in refused}


def _write_similarity(out, lab, released, paths, solution=None):
    """OUT/similarity.md and .csv for the whole class (also after --only or --resume: a pair needs both answers).

    A report that fails is said on stderr and in logs/grader.log: the grades are written and stand without it."""
    try:
        similarity_report.write(out, lab, released, paths, solution)  # reads only: 200 students in about 2 CPU-s
    except Exception as exc:
        why = f"the similarity report failed ({type(exc).__name__}: {exc}); grades.csv is complete"
        print(f"grade: {why}", file=sys.stderr)
        with open(pathlib.Path(out) / "logs" / "grader.log", "a") as log:
            log.write(f"{why}\n")


def _to_grade(out, paths, resume, only):
    if only:
        unknown = sorted(set(only) - set(paths))
        if unknown:
            raise GradingError(f"--only {' '.join(unknown)}: no such submission; students: {', '.join(sorted(paths))}")
        return [(s, paths[s]) for s in only]
    if resume:
        return [(s, p) for s, p in paths.items() if not _trusted(out, s)]
    return list(paths.items())


def _trusted(out, student):
    import json

    path = result_path(out, student)
    try:
        return json.loads(path.read_text())["status"] != "grader_error"
    except (OSError, ValueError, KeyError):
        return False


def default_limits(hidden, root=ROOT):
    """Limits with every fence this machine allows; directories the graded code must not see.

    root: the repository the kernel reads (read-only), this one but in tests."""
    root = pathlib.Path(root)
    pythons = (sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix)
    # The course's own answers are hidden whatever lab is graded: a private course's solutions may sit beside them.
    # So are artifacts/ and an earlier run's OUT left in the repository: a class's answers, a run's seed and values.
    hidden = [*hidden, root / ".git", root / "tests", root / "solutions", probe_files.DEFAULT_DIR, root / "artifacts",
              *grading_runs(root, skip=pythons)]
    return Limits(fences=available_fences(), hidden_dirs=tuple(str(pathlib.Path(d).resolve()) for d in hidden),
                  readonly_dirs=(str(root), *pythons))


def main(argv=None):
    parser = argparse.ArgumentParser(description="Grade every notebook of a class for one lab.")
    parser.add_argument("--lab", required=True, help="lab number, e.g. 03")
    parser.add_argument("--submissions", required=True, help="directory of <student>.ipynb files")
    parser.add_argument("--out", required=True, help="output directory (created)")
    parser.add_argument("--probes", default=None, help="directory of private probe files labNN.py")
    parser.add_argument("--solutions", default=None, help="directory of private solutions NN_*.ipynb")
    parser.add_argument("--labs", default=None, help="directory of the released labs NN_*.ipynb (default: labs/)")
    parser.add_argument("--jobs", type=int, default=2, help="submissions graded in parallel")
    parser.add_argument("--resume", action="store_true", help="grade only students without a trusted result in OUT")
    parser.add_argument("--only", nargs="+", default=(), metavar="STUDENT", help="re-grade these students only")
    parser.add_argument("--format", choices=("canvas", "gradescope", "moodle", "csv"), default=None,
                        help="also write OUT/gradebook-FORMAT.csv for that LMS")
    parser.add_argument("--assignment", default=None, help="the LMS's column name (default: 'Lab NN')")
    parser.add_argument("--deadline", default=None, help="ISO time, e.g. 2026-12-01T23:59+01:00: apply the late policy")
    parser.add_argument("--late-per-day", type=float, default=0.1, help="fraction of the points lost per day late")
    parser.add_argument("--late-max-days", type=int, default=7, help="later than this scores 0")
    parser.add_argument("--times", default=None, help="CSV student,submitted_iso (default: the files' mtimes)")
    options = parser.parse_args(argv)
    if not pathlib.Path(options.submissions).is_dir():
        print(f"grade: {options.submissions} is not a directory of notebooks", file=sys.stderr)
        return 2
    for gap in available_fences().missing():
        print(f"grade: missing fence: {gap}", file=sys.stderr)
    try:
        results = grade(options.lab, options.submissions, options.out, probes_dir=options.probes,
                        solutions_dir=options.solutions, labs_dir=options.labs, jobs=options.jobs,
                        resume=options.resume, only=options.only)
    except (GradingError, run_state.StateError, FileNotFoundError, ValueError) as exc:
        print(f"grade: {exc}", file=sys.stderr)
        return 2
    print(f"graded {len(results)} submission(s) into {options.out}/grades.csv; answers alike: "
          f"{options.out}/similarity.md")
    pending = _pending(options, results)
    if pending:
        print(f"{pending} of {len(results)} student(s) have parts graded by hand without points: fill the points "
              f"column of {options.out}/manual.csv (the texts are in {options.out}/manual/), then run the same "
              "command with RESUME=1 (--resume); their LMS grade stays blank until then")
    if options.format:
        print(f"wrote {_export(options, results)}")
    return 0


def _pending(options, results):
    """How many students still lack points for a part graded by hand."""
    from helpers.grading import manual

    items = probe_files.load_manual(f"{int(options.lab):02d}", options.probes)
    points = manual.read_points(options.out, items) if items else {}
    return sum(not manual.earned(points, r["student"], items)[1] for r in results) if items else 0


def _export(options, results):
    """The LMS file of main's options."""
    lab = f"{int(options.lab):02d}"
    deadline = gradebook.parse_time(options.deadline) if options.deadline else None
    times = (gradebook.times_from_csv(options.times) if options.times
             else gradebook.times_from_mtimes(submissions.listing(options.submissions)[0].values()))
    return write_lms(options.out, results, probe_files.load(lab, options.probes)[1], options.format,
                     assignment=options.assignment or f"Lab {lab}", deadline=deadline,
                     per_day=options.late_per_day, max_days=options.late_max_days, times=times,
                     items=probe_files.load_manual(lab, options.probes))


if __name__ == "__main__":
    sys.exit(main())
