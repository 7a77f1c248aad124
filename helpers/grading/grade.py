"""Grade a class: `make grade LAB=03 SUBMISSIONS=dir OUT=dir [PROBES=dir]`.

    python -m helpers.grading.grade --lab 03 --submissions dir --out dir [--probes dir] [--jobs 2]
                                    [--resume | --only STUDENT ... | --fresh]
                                    [--format canvas --assignment 'Lab 03 (12345)']
                                    [--deadline 2026-12-01T23:59+01:00 --late-per-day 0.1 --late-max-days 7
                                     --times times.csv]
                                    [--init | --shard K/N]   (a class on many machines: shards.py)

Writes OUT/grades.csv, OUT/feedback/<student>.md, OUT/executed/<student>.ipynb, OUT/cells.csv (every cell's
status and duration), OUT/results/<student>.json (what --resume trusts), OUT/logs/ (kernels' own output,
the grader's errors), OUT/return/<student>/ (what goes back to the student: returns.py), OUT/similarity.md and .csv
(pairs of students whose answers are unusually alike: helpers/grading/report/similarity.py) and, with --format, the
LMS's
import file OUT/gradebook-FORMAT.csv. With a deadline, grades.csv, the results, the feedback and the LMS file carry
each student's lateness and `final` points (helpers/grading/report/gradebook.py, report.py). Only a regular file
SUBMISSIONS/<student>.ipynb is read; a symlink, FIFO, device or directory of that name is an `error` row and is never
opened (helpers/grading/prepare/submissions.py). Exits 0 whatever the students did; non-zero only when grading itself
cannot
run (no such lab, probes failing on the solution, an unwritable OUT, bad options, an OUT it must not write into).

One OUT holds one run (state.py): an OUT that holds anything is refused, saying what to pass. Each student is graded
in a process of its own; one that dies or overruns is that student's `grader_error`, and the class goes on.
`--resume` keeps the results already in OUT and grades only the students without one or with a `grader_error`;
`--only` re-grades the named students; both reuse the run's secret probe seed, its SUBMISSIONS folder (another is
refused) and its options where none is given. `--fresh` deletes the run in OUT and grades anew, with a new seed.
"""
import argparse
import dataclasses
import datetime
import multiprocessing
import multiprocessing.connection
import os
import pathlib
import re
import secrets
import sys
import time

import nbformat

from helpers.grading import probes as probe_files
from helpers.grading import state as run_state
from helpers.grading.judge import reference
from helpers.grading.prepare import submissions
from helpers.grading.progress import Progress
from helpers.grading.report import gradebook, returns, similarity_report
from helpers.grading.report.report import load_results, write_lms, write_outputs
from helpers.grading.run import cgroup
from helpers.grading.run.execute import Limits
from helpers.grading.run.grade_student import (
    SolutionFailed,
    Task,
    grade_student,
    memory_limit_result,
    refused_result,
    result_path,
    solution_values,
    write_result,
    zero_marks,
)
from helpers.grading.run.sandbox import available_fences, grading_runs
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
    try:
        return solution_values(released, solution, setup, probes, seed, limits, references)
    except SolutionFailed as exc:
        raise GradingError(str(exc)) from None


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
    forkserver.ensure_running(["helpers.grading.run.grade_student"])
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
        memory = cgroup.grader_memory_hits(process.pid)  # its memory cgroup killed it: read before it goes
        cgroup.remove_left_by(process.pid)  # its own memory cgroup; its kernels' too, if it was killed
        del running[sentinel]
        _check_result(task, student, process.exitcode, overdue, hard_limit, time.monotonic() - began, memory)
        progress.finished(student)


def _check_result(task, student, exitcode, overdue, hard_limit, seconds, memory=0):
    """A grading process that left no result is a grader_error for that student, with the reason; one its memory
    cgroup killed (memory: how often it killed), that student's memory_limit."""
    path = result_path(task.out, student)
    if exitcode == 0 and path.exists() and not overdue:
        return
    setup, probes = probe_files.load(task.lab, task.probes_dir)
    if memory and not overdue:
        result = memory_limit_result(student, probes, task.limits.grader_memory_bytes)
        write_result(task.out, {**result, "seconds": round(seconds, 1)})
        why = result["error"]
    else:
        why = (f"grading took longer than {hard_limit:.0f} s and was stopped" if overdue
               else f"the grading process died (exit code {exitcode})")
        write_result(task.out, {"student": student, "status": "grader_error", "missing": [], "cells": [],
                                "kernels": 0, "marks": zero_marks(probes, why), "error": why,
                                "seconds": round(seconds, 1)})
    with open(pathlib.Path(task.out) / "logs" / "grader.log", "a") as log:
        log.write(f"{student}: {why}\n")


def kernel_threads(jobs):
    """Intra-op threads per graded kernel: the cores shared by the kernels that run at once. With torch's
    default (every core) in each, 2 kernels on 2 cores spin-wait on each other: in make test's own kernels it
    cost 17% more CPU seconds (tests/test_mistakes.py -k "lab01 or lab06" + chapters 01, 06: 63-67 vs 51-57 s)."""
    return max(1, (os.cpu_count() or 1) // max(1, jobs))


@dataclasses.dataclass(frozen=True)
class Options:
    """What the instructor chose beyond the class: the LMS file and the late policy. None: as the run recorded in
    OUT chose (--resume, --only), else the default."""

    format: str | None = None  # canvas | gradescope | moodle | csv: also write OUT/gradebook-FORMAT.csv
    assignment: str | None = None  # the LMS's column name (default 'Lab NN'; Canvas: 'Name (id)', see gradebook.py)
    deadline: str | None = None  # ISO 8601; without one, no late policy
    late_per_day: float | None = None  # fraction of the points lost per day started late (default 0.1)
    late_max_days: int | None = None  # later than this scores 0 (default 7)
    times: str | None = None  # CSV student,submitted_iso (default: the files' modification times)

    def merged(self, earlier):
        """These options, with the run's earlier ones ({field: value} from state.json) where these are None."""
        given = {k: v for k, v in dataclasses.asdict(self).items() if v is not None}
        known = {k: v for k, v in (earlier or {}).items() if k in {f.name for f in dataclasses.fields(self)}}
        return Options(**{**known, **given})

    def late_policy(self):
        """The LatePolicy, or None without a deadline; raises ValueError naming what to pass."""
        if self.deadline is None:
            return None
        try:
            deadline = gradebook.parse_time(self.deadline)
        except ValueError:
            raise ValueError(f"DEADLINE={self.deadline!r} is not an ISO 8601 time: pass e.g. "
                             "2026-12-01T23:59+01:00") from None
        per_day = 0.1 if self.late_per_day is None else self.late_per_day
        max_days = 7 if self.late_max_days is None else self.late_max_days
        if not 0 <= per_day <= 1:
            raise ValueError(f"LATE_PER_DAY={per_day:g}: pass a fraction of the points per day in [0, 1], e.g. 0.1 "
                             "for 10 % a day")
        if max_days < 0:
            raise ValueError(f"LATE_MAX_DAYS={max_days}: pass a number of days >= 0 (later than that scores 0)")
        return gradebook.LatePolicy(deadline, per_day, max_days)

    def check(self, lab):
        """Refuse bad options before anything is graded: the same errors the end of the run would meet."""
        if self.format is not None and self.format not in gradebook.FORMATS:
            raise ValueError(f"FORMAT={self.format}: pass one of {', '.join(gradebook.FORMATS)}")
        policy = self.late_policy()
        if self.times is not None:
            gradebook.times_from_csv(self.times)
        if policy is None and (self.late_per_day is not None or self.late_max_days is not None or self.times):
            raise ValueError("LATE_PER_DAY, LATE_MAX_DAYS and TIMES apply a late policy: pass its DEADLINE too")
        return self.assignment or f"Lab {lab}"


class Graded(list):
    """Every student's result (dicts, in order), and what this run did: `graded` (the students graded now), `lms`
    (the LMS file written, or None) and `notes` (lines for the instructor)."""

    def __init__(self, results, graded, lms=None, notes=()):
        super().__init__(results)
        self.graded, self.lms, self.notes = list(graded), lms, list(notes)


def grade(lab, submissions_dir, out, *, probes_dir=None, jobs=2, limits=None, labs_dir=None, solutions_dir=None,
          resume=False, only=(), fresh=False, options=None, init=False, shard=None):
    """Grade every *.ipynb in submissions_dir into out; return the per-student results (a Graded list of dicts).

    out must be new or empty, unless resume (finish the run in out), only (re-grade those students of it) or fresh
    (delete it first): run_state.start. options: the LMS file and late policy (Options).
    A class graded on several machines (shards.py): init writes the run's state in out (its seed, the solution's
    values, the options) and grades no one; shard (k, n) grades slice k of n into out/shards/k-of-n/ with that state,
    and `shards.merge` writes the class's reports from the slices."""
    lab, out = f"{int(lab):02d}", pathlib.Path(out)
    began = datetime.datetime.now(datetime.timezone.utc)
    if jobs < 1:
        raise ValueError(f"JOBS={jobs}: pass at least 1 (submissions graded at once; 2 on 2 cores)")
    released = nbformat.read(lab_notebook(labs_dir or ROOT / "labs", lab), as_version=4)
    solution_path = lab_notebook(solutions_dir or ROOT / "solutions", lab)
    setup, probes = probe_files.load(lab, probes_dir)
    probe_file = pathlib.Path(probes_dir or probe_files.DEFAULT_DIR) / f"lab{lab}.py"
    fingerprint = run_state.fingerprint(lab_notebook(labs_dir or ROOT / "labs", lab), solution_path, probe_file)
    options = options or Options()
    options.check(lab)  # before an earlier run is deleted (fresh) or anything is graded
    paths, refused = submissions.listing(submissions_dir)
    work = out  # where the students' results go: OUT, or a shard's own folder in it
    if shard is not None:  # the run's state is OUT's, written by init; nothing of OUT but the shard's folder changes
        from helpers.grading import shards  # shards.py imports this module

        state, work, todo = shards.begin(out, lab, fingerprint, submissions_dir, shard, {**paths, **refused},
                                         only=only, fresh=fresh, options=options)
        # It writes no report: the run's options (a TIMES file) need not reach its machine.
    else:
        todo = [] if init else _to_grade(out, {**paths, **refused}, resume, only)
        state = run_state.start(out, lab, fingerprint, submissions_dir, resume=resume, only=bool(only), fresh=fresh)
        options = options.merged(state.get("options"))  # --resume, --only: the run's own choices where none is given
    options.check(lab)
    limits = limits or default_limits([probes_dir or probe_files.DEFAULT_DIR, solutions_dir or ROOT / "solutions",
                                       submissions_dir, out])
    limits = dataclasses.replace(limits, preload_dynamo=ranks_need_dynamo(released, setup),
                                 threads=limits.threads or kernel_threads(jobs))
    for sub in ("executed", "feedback", "results", "logs"):
        (work / sub).mkdir(parents=True, exist_ok=True)
    if shard is None:
        state = {**state, "options": {k: v for k, v in dataclasses.asdict(options).items() if v is not None},
                 **({"began": began.isoformat(), "run": secrets.token_hex(8)} if init else {})}  # shards.py
        run_state.save(out, state)  # the options given now are the run's from here on
    ctx = None if init else _context()
    solution = nbformat.read(solution_path, as_version=4)
    # One mistake, one question: the earlier answers a question's probes call are the solution's (reference.py).
    references = reference.references(solution, probe_files.load_uses(lab, probes_dir))
    expected = state.get("expected")
    if expected is None:
        expected = expected_values(released, solution, setup, probes, state["seed"], limits, references)
        run_state.save(out, {**state, "expected": expected})
    if init:
        return Graded([], [])
    task = Task(lab, released, str(probes_dir) if probes_dir else None, expected, state["seed"], str(work), limits,
                references, secret=state.get("secret", ""), first=state.get("students", {}), solution=solution)
    refuse(work, lab, probes_dir, {s: refused[s] for s, _ in todo if s in refused})
    run_class(task, [(s, p) for s, p in todo if s in paths], jobs, student_limit(released, limits), ctx)
    if shard is not None:
        return shards.graded(out, state, shard, work, {**paths, **refused}, todo)
    return report_class(out, lab, released, solution, paths, refused, submissions_dir=submissions_dir,
                        probes_dir=probes_dir, labs_dir=labs_dir, options=options, began=began,
                        graded=[s for s, _ in todo])


def report_class(out, lab, released, solution, paths, refused, *, submissions_dir, probes_dir, labs_dir, options,
                 began, graded):
    """Everything OUT holds beyond the results: grades.csv, feedback, the LMS file, returns, the similarity report.

    The same for a class graded at once and for one merged from its shards (shards.merge); returns a Graded list.
    paths, refused: SUBMISSIONS's listing; began: the run's start (a later submission time is flagged, not charged);
    graded: the students this command graded."""
    assignment = options.check(lab)
    probes = probe_files.load(lab, probes_dir)[1]
    results = load_results(out, sorted({**paths, **refused}))
    notes = _late(results, options, paths, began)
    items = probe_files.load_manual(lab, probes_dir)
    write_outputs(out, probes, results, items)  # sets each result's final
    for result in results:
        write_result(out, result)  # results/<student>.json: lateness and final too
    lms = write_lms(out, results, probes, options.format, assignment=assignment, items=items) if options.format \
        else None
    if options.format == "canvas" and not re.search(r"\(\d+\)$", assignment.strip()):
        notes.append(f"ASSIGNMENT={assignment!r} names no Canvas assignment id: Canvas imports the column as a new "
                     "assignment; to fill an existing one, copy its column's header from a gradebook export, e.g. "
                     f"ASSIGNMENT='{assignment} (12345)'")
    returns.write_all(out, results, lab_notebook(labs_dir or ROOT / "labs", lab).name)  # OUT/return/<student>/
    _write_similarity(out, lab, released, {**paths, **refused_paths(submissions_dir, refused)}, solution)
    return Graded(results, graded, lms, notes)


def _late(results, options, paths, now):
    """Record each result's lateness under the late policy, if any (gradebook.lateness); return notes on the times
    that were not charged."""
    policy = options.late_policy()
    if policy is None:
        for result in results:  # an earlier run's policy, dropped since: nothing stays charged
            for key in ("submitted", "deadline", "late_days", "penalty", "time_note"):
                result.pop(key, None)
        return []
    times = gradebook.times_from_csv(options.times) if options.times else gradebook.times_from_mtimes(paths.values())
    for result in results:
        result.update(gradebook.lateness(times.get(result["student"]), policy, now))
    notes = []
    for note, what in ((gradebook.AFTER_RUN, "a submission time after this run"),
                       (gradebook.NO_TIME, "no submission time")):
        who = [r["student"] for r in results if r["time_note"] == note]
        if who:
            notes.append(f"{len(who)} student(s) with {what} ({', '.join(who[:5])}{', ...' if len(who) > 5 else ''}):"
                         " not charged a late penalty; check their time (time_note in grades.csv)")
    return notes


def refuse(out, lab, probes_dir, refused):
    """An `error` result for each entry of SUBMISSIONS that is not a regular file {student: why}: none is opened."""
    probes = probe_files.load(lab, probes_dir)[1]
    for student, why in refused.items():
        write_result(out, {**refused_result(student, probes, why), "seconds": 0.0})


def refused_paths(directory, refused):
    """{student: submissions.Refused(why)} of the refused entries: the similarity report lists them as not read, with
    why, without opening one (a refused name's id is no file of directory's)."""
    return {student: submissions.Refused(why) for student, why in refused.items()}


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


def arguments():
    """The command line of `python -m helpers.grading.grade`, which `make grade` writes from its variables."""
    parser = argparse.ArgumentParser(description="Grade every notebook of a class for one lab.")
    parser.add_argument("--lab", required=True, help="lab number, e.g. 03")
    parser.add_argument("--submissions", required=True, help="directory of <student>.ipynb files")
    parser.add_argument("--out", required=True, help="output directory: new or empty (or --resume, --only, --fresh)")
    parser.add_argument("--probes", default=None, help="directory of private probe files labNN.py")
    parser.add_argument("--solutions", default=None, help="directory of private solutions NN_*.ipynb")
    parser.add_argument("--labs", default=None, help="directory of the released labs NN_*.ipynb (default: labs/)")
    parser.add_argument("--jobs", type=int, default=2, help="submissions graded in parallel")
    parser.add_argument("--resume", action="store_true", help="grade only students without a trusted result in OUT")
    parser.add_argument("--only", nargs="+", default=(), metavar="STUDENT", help="re-grade these students only")
    parser.add_argument("--fresh", action="store_true", help="delete the earlier run in OUT, then grade the class")
    parser.add_argument("--init", action="store_true", help="write the run's state in OUT (seed, the solution's "
                        "values, the options) and grade no one: then --shard k/N anywhere, then helpers.grading.shards")
    parser.add_argument("--shard", default=None, metavar="K/N", help="grade the k-th of N slices of the class into "
                        "OUT/shards/k-of-N/, with the state --init wrote in OUT (shards.py)")
    parser.add_argument("--format", choices=tuple(gradebook.FORMATS), default=None,
                        help="also write OUT/gradebook-FORMAT.csv for that LMS")
    parser.add_argument("--assignment", default=None, help="the LMS's column name (default: 'Lab NN')")
    parser.add_argument("--deadline", default=None, help="ISO time, e.g. 2026-12-01T23:59+01:00: apply the late policy")
    parser.add_argument("--late-per-day", type=float, default=None, help="fraction of the points lost per day late "
                        "(default 0.1)")
    parser.add_argument("--late-max-days", type=int, default=None, help="later than this scores 0 (default 7)")
    parser.add_argument("--times", default=None, help="CSV student,submitted_iso (default: the files' mtimes)")
    return parser


def main(argv=None):
    options = arguments().parse_args(argv)
    if not pathlib.Path(options.submissions).is_dir():
        print(f"grade: {options.submissions} is not a directory of notebooks", file=sys.stderr)
        return 2
    for gap in available_fences().missing():
        print(f"grade: missing fence: {gap}", file=sys.stderr)
    chosen = Options(options.format, options.assignment, options.deadline, options.late_per_day,
                     options.late_max_days, str(pathlib.Path(options.times).resolve()) if options.times else None)
    try:
        shard = _shard(options)
        results = grade(options.lab, options.submissions, options.out, probes_dir=options.probes,
                        solutions_dir=options.solutions, labs_dir=options.labs, jobs=options.jobs,
                        resume=options.resume, only=options.only, fresh=options.fresh, options=chosen,
                        init=options.init, shard=shard)
    except (GradingError, run_state.StateError, FileNotFoundError, ValueError) as exc:
        print(f"grade: {exc}", file=sys.stderr)
        return 2
    if options.init or shard:
        print(*results.notes or [f"wrote {options.out}/state.json (the run's seed and the solution's values): now "
                                 f"make grade ... OUT={options.out} SHARD=k/N for k = 1 to N, anywhere, then "
                                 f"make grade-merge OUT={options.out}"], sep="\n")
        return 0
    print(graded_line(results, options.out))
    pending = _pending(options, results)
    if pending:
        print(f"{pending} of {len(results)} student(s) have parts graded by hand without points: fill the points "
              f"column of {options.out}/manual.csv (the texts are in {options.out}/manual/), then run the same "
              "command with RESUME=1 (--resume); their LMS grade stays blank until then")
    for note in results.notes:
        print(f"grade: {note}")
    if results.lms:
        print(f"wrote {results.lms}")
    return 0


def _shard(options):
    """(k, n) of --shard, None without; refuses what --init and --shard cannot be given with."""
    if options.init and (options.resume or options.only or options.shard):
        raise ValueError("--init (make grade-init) writes a new run's state in OUT: pass it without RESUME, ONLY and "
                         "SHARD (FRESH=1 replaces an earlier run)")
    if options.shard is None:
        return None
    from helpers.grading import shards  # shards.py imports this module

    return shards.parse_shard(options.shard)


def graded_line(results, out):
    """What this run graded, and where the class's grades are."""
    count = len(results.graded)
    kept = f" ({len(results) - count} kept from the earlier run)" if count < len(results) else ""
    return (f"graded {count} submission{'' if count == 1 else 's'}{kept} into {out}/grades.csv "
            f"({len(results)} student{'' if len(results) == 1 else 's'}); answers alike: {out}/similarity.md")


def _pending(options, results):
    """How many students still lack points for a part graded by hand."""
    from helpers.grading.report import manual

    items = probe_files.load_manual(f"{int(options.lab):02d}", options.probes)
    points = manual.read_points(options.out, items) if items else {}
    return sum(not manual.earned(points, r["student"], items)[1] for r in results) if items else 0


if __name__ == "__main__":
    sys.exit(main())
