"""Grade a class: `make grade LAB=03 SUBMISSIONS=dir OUT=dir [PROBES=dir]`.

    python -m helpers.grading.grade --lab 03 --submissions dir --out dir [--probes dir] [--jobs 2]

Writes OUT/grades.csv, OUT/feedback/<student>.md, OUT/executed/<student>.ipynb and OUT/cells.csv
(every cell's status and duration). Exits 0 whatever the students did; non-zero only when grading
itself cannot run (no such lab, probes failing on the solution, an unwritable OUT).
"""
import argparse
import concurrent.futures
import csv
import multiprocessing
import os
import pathlib
import sys
import tempfile
import time

import nbformat

from helpers.grading import probes as probe_files
from helpers.grading.assemble import assemble, probe_values
from helpers.grading.execute import Limits, execute
from helpers.grading.feedback import feedback_markdown
from helpers.grading.plain import compare
from helpers.grading.sandbox import can_drop_user, can_isolate_network

ROOT = pathlib.Path(__file__).resolve().parents[2]


class GradingError(RuntimeError):
    """Grading itself cannot run; the message says what to fix."""


def lab_notebook(directory, lab):
    """The one notebook NN_*.ipynb of lab NN in directory."""
    found = sorted(pathlib.Path(directory).glob(f"{lab}_*.ipynb"))
    if len(found) != 1:
        raise GradingError(f"expected one notebook {lab}_*.ipynb in {directory}, found {len(found)}")
    return found[0]


def run_one(released, submission, setup, probes, workdir, limits):
    """Execute one submission; return (executed notebook, Execution, {question: probe values}, missing)."""
    graded, nonces, missing = assemble(released, submission, setup, probes)
    execution = execute(graded, workdir, limits)
    values = {q: probe_values(graded, q, nonce) for q, nonce in nonces.items()}
    return graded, execution, values, missing


def score(probes, expected, values):
    """{question: [(probe, points earned, message)]} comparing values with the solution's."""
    marks = {}
    for probe in probes:
        got = values.get(probe.question, {}).get(probe.name)
        if got is None:
            earned, message = 0.0, "did not run (an earlier cell failed, timed out or killed the kernel)"
        elif "error" in got:
            earned, message = 0.0, got["error"]
        else:
            ok, message = compare(expected[probe.question][probe.name]["value"], got["value"], probe.rtol, probe.atol)
            earned = probe.points if ok else 0.0
        marks.setdefault(probe.question, []).append((probe, earned, message))
    return marks


def expected_values(released, solution, setup, probes, limits):
    """The solution's probe values; every probe must succeed on it."""
    with tempfile.TemporaryDirectory(prefix="grade-solution-") as workdir:
        os.chmod(workdir, 0o755)
        _, execution, values, missing = run_one(released, solution, setup, probes, workdir, limits)
    failed = [p.name for p in probes if "value" not in values.get(p.question, {}).get(p.name, {})]
    if missing or failed:
        raise GradingError(f"the solution does not pass its own probes ({missing or failed}; status "
                           f"{execution.status}): fix the probes or the solution before grading")
    return values


def grade_submission(task):
    """Grade one student (runs in a pool worker). Returns the row and log data; never raises."""
    student, path, released, setup, probes, expected, out, limits = task
    start = time.monotonic()
    try:
        submission = nbformat.read(path, as_version=4)
    except Exception as exc:  # noqa: BLE001 - any unreadable file is the student's problem
        return _unreadable(student, probes, start, exc)
    with tempfile.TemporaryDirectory(prefix="grade-") as workdir:  # short: unix socket paths live in it
        os.chmod(workdir, 0o755)
        graded, execution, values, missing = run_one(released, submission, setup, probes, workdir, limits)
    marks = score(probes, expected, values)
    status = "missing" if len(missing) == len({p.question for p in probes}) else execution.status
    nbformat.write(graded, pathlib.Path(out) / "executed" / f"{student}.ipynb")
    return {"student": student, "marks": marks, "status": status, "missing": missing,
            "seconds": round(time.monotonic() - start, 1), "cells": execution.cells}


def _unreadable(student, probes, start, exc):
    marks = {}
    for p in probes:
        marks.setdefault(p.question, []).append((p, 0.0, "the notebook could not be read"))
    return {"student": student, "marks": marks, "status": "error", "missing": [],
            "seconds": round(time.monotonic() - start, 1), "cells": [],
            "error": f"not a readable notebook: {type(exc).__name__}: {exc}"}


def write_outputs(out, probes, results):
    """grades.csv, feedback/*.md and cells.csv from the graded results."""
    questions = sorted({p.question for p in probes}, key=lambda q: [int(x) for x in q.split(".")])
    maximum = sum(p.points for p in probes)
    with open(pathlib.Path(out) / "grades.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["student", *questions, "total", "max", "status", "seconds"])
        for r in results:
            earned = {q: sum(e for _, e, _ in r["marks"].get(q, [])) for q in questions}
            writer.writerow([r["student"], *(f"{earned[q]:g}" for q in questions),
                             f"{sum(earned.values()):g}", f"{maximum:g}", r["status"], r["seconds"]])
    for r in results:
        (pathlib.Path(out) / "feedback" / f"{r['student']}.md").write_text(feedback_markdown(r, questions))
    with open(pathlib.Path(out) / "cells.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["student", "cell", "kind", "status", "seconds"])
        for r in results:
            for c in r["cells"]:
                writer.writerow([r["student"], c["index"], c["kind"], c["status"], c["seconds"]])


def grade(lab, submissions, out, *, probes_dir=None, jobs=2, limits=None, labs_dir=None, solutions_dir=None):
    """Grade every *.ipynb in submissions into out; return the per-student results."""
    lab = f"{int(lab):02d}"
    released = nbformat.read(lab_notebook(labs_dir or ROOT / "labs", lab), as_version=4)
    solution = nbformat.read(lab_notebook(solutions_dir or ROOT / "solutions", lab), as_version=4)
    setup, probes = probe_files.load(lab, probes_dir)
    limits = limits or default_limits([probes_dir or probe_files.DEFAULT_DIR, solutions_dir or ROOT / "solutions",
                                       submissions, out])
    for sub in ("executed", "feedback"):
        (pathlib.Path(out) / sub).mkdir(parents=True, exist_ok=True)
    expected = expected_values(released, solution, setup, probes, limits)
    paths = sorted(pathlib.Path(submissions).glob("*.ipynb"))
    tasks = [(p.stem, str(p), released, setup, probes, expected, str(out), limits) for p in paths]
    # Kernels, not this process, do the work; a fresh interpreter per worker keeps them independent.
    with concurrent.futures.ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
        results = list(pool.map(grade_submission, tasks))
    write_outputs(out, probes, results)
    return results


def default_limits(hidden):
    """Limits with every fence this machine allows; directories the graded code must not see."""
    isolate = can_isolate_network()
    return Limits(isolate_network=isolate, drop_user=can_drop_user(),
                  hidden_dirs=tuple(str(pathlib.Path(d).resolve()) for d in hidden),
                  readonly_dirs=(str(ROOT), sys.prefix))


def main(argv=None):
    parser = argparse.ArgumentParser(description="Grade every notebook of a class for one lab.")
    parser.add_argument("--lab", required=True, help="lab number, e.g. 03")
    parser.add_argument("--submissions", required=True, help="directory of <student>.ipynb files")
    parser.add_argument("--out", required=True, help="output directory (created)")
    parser.add_argument("--probes", default=None, help="directory of private probe files labNN.py")
    parser.add_argument("--jobs", type=int, default=2, help="submissions graded in parallel")
    options = parser.parse_args(argv)
    if not pathlib.Path(options.submissions).is_dir():
        print(f"grade: {options.submissions} is not a directory of notebooks", file=sys.stderr)
        return 2
    try:
        results = grade(options.lab, options.submissions, options.out, probes_dir=options.probes, jobs=options.jobs)
    except (GradingError, FileNotFoundError, ValueError) as exc:
        print(f"grade: {exc}", file=sys.stderr)
        return 2
    print(f"graded {len(results)} submission(s) into {options.out}/grades.csv")
    return 0


if __name__ == "__main__":
    sys.exit(main())
