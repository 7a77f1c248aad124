"""Time the grader on a class: `python -m tests.bench_grading [--lab 03] [--students 20] [--jobs 2]`.

The class is made from the lab itself: a third copy the solution, a third the untouched student
lab, a third the solution with one answer cell reverted to the TODO. It is graded as a class on many machines is
(helpers/grading/shards.py), one shard on this one: `grade --init` (the solution's run, once per class), `grade
--shard 1/1` (every student), the merge (the reports). Prints each step's wall time and CPU seconds (every process
it started, grandchildren too), the submissions graded per core-minute (students / the shard's CPU minutes: what a
core of another machine of this kind grades, whatever N) and the grades' totals, so a regression in the grader's speed
or in its verdicts shows at once.
"""
import argparse
import collections
import csv
import ctypes
import os
import pathlib
import resource
import subprocess
import sys
import tempfile
import time

import nbformat

from helpers.grading import grade as grading
from helpers.grading.prepare.assemble import answer_questions
from helpers.grading.prepare.labgen import ROOT


def make_class(lab, students, directory):
    solution = nbformat.read(grading.lab_notebook(ROOT / "solutions", lab), as_version=4)
    student = nbformat.read(grading.lab_notebook(ROOT / "labs", lab), as_version=4)
    answers = [i for i, c in enumerate(student.cells) if answer_questions(c)]
    for k in range(students):
        kind = k % 3
        nb = solution if kind == 0 else student if kind == 1 else nbformat.from_dict(solution)
        if kind == 2:  # one answer reverted to the TODO: partial credit
            nb.cells[answers[k % len(answers)]].source = student.cells[answers[k % len(answers)]].source
        nbformat.write(nb, pathlib.Path(directory) / f"student{k:02d}.ipynb")


CPUACCT = "/sys/fs/cgroup/cpuacct"  # cgroup v1; the graded kernels' pids cgroups are in another hierarchy


def adopt_orphans():
    """Make this process the reaper of its descendants whose parent exits first (the grader's forkservers): their CPU
    time then counts in RUSAGE_CHILDREN once reaped (Linux prctl PR_SET_CHILD_SUBREAPER); False where unavailable."""
    try:
        return ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def timed(argv, patience=60.0):
    """(wall seconds, CPU seconds of every process it started, how they were counted) of one command.

    A cpuacct cgroup of its own where this machine lets us make one (root, cgroup v1): it counts every process the
    command starts. Else RUSAGE_CHILDREN, this process the reaper of orphans: it misses a process whose parent ignored
    SIGCHLD (auto-reaped), so it can only undercount."""
    group = pathlib.Path(CPUACCT) / f"dp-bench-{os.getpid()}"
    try:
        group.mkdir(exist_ok=True)
        prefix = ["sh", "-c", f'echo $$ > {group}/cgroup.procs && exec "$@"', "sh"]
        usage = group / "cpuacct.usage"
        usage.write_text("0")
    except OSError:
        prefix = usage = None
    before, start = resource.getrusage(resource.RUSAGE_CHILDREN), time.monotonic()
    subprocess.run([*(prefix or []), *argv], check=True, cwd=ROOT, stdout=subprocess.DEVNULL)
    wall, deadline = time.monotonic() - start, time.monotonic() + patience
    while time.monotonic() < deadline:  # the forkservers exit once their parent has: reap them
        try:
            if os.waitpid(-1, os.WNOHANG)[0] == 0:
                time.sleep(0.1)
        except ChildProcessError:
            break
    if usage is not None:
        cpu = int(usage.read_text()) / 1e9
        for _ in range(50):  # a process still exiting keeps the group busy for a moment
            try:
                group.rmdir()
                break
            except OSError:
                time.sleep(0.1)
        return wall, cpu, "cpuacct cgroup"
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime), "RUSAGE_CHILDREN"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lab", default="03")
    parser.add_argument("--students", type=int, default=20)
    parser.add_argument("--jobs", type=int, default=2)
    options = parser.parse_args()
    lab = f"{int(options.lab):02d}"
    adopt_orphans()
    with tempfile.TemporaryDirectory() as tmp:
        submissions, out = pathlib.Path(tmp) / "submissions", pathlib.Path(tmp) / "out"
        submissions.mkdir()
        make_class(lab, options.students, submissions)
        grade = [sys.executable, "-m", "helpers.grading.grade", "--lab", lab, "--submissions", str(submissions),
                 "--out", str(out), "--jobs", str(options.jobs)]
        steps = {"init (the solution, once)": timed([*grade, "--init"]),
                 "shard 1/1 (every student)": timed([*grade, "--shard", "1/1"]),
                 "merge (the reports)": timed([sys.executable, "-m", "helpers.grading.shards", "--out", str(out)])}
        with open(out / "grades.csv") as f:
            rows = list(csv.DictReader(f))
    totals = collections.Counter(f"{r['total']}/{r['max']} {r['status']}" for r in rows)
    wall = sum(w for w, _, _ in steps.values())
    counted = next(iter(steps.values()))[2]
    print(f"lab {lab}: graded {len(rows)} submissions in {wall:.0f} s, {options.jobs} at a time on "
          f"{os.cpu_count()} cores (load average at the end {os.getloadavg()[0]:.1f})")
    for step, (seconds, cpu, _) in steps.items():
        print(f"  {step:28s} {seconds:6.1f} s wall {cpu:7.1f} CPU-s")
    shard_cpu = steps["shard 1/1 (every student)"][1]
    print(f"  per core: {shard_cpu / len(rows):.1f} CPU-s a submission, {60 * len(rows) / shard_cpu:.1f} submissions "
          f"per core-minute (the shard's CPU, counted by {counted}; init and merge run once per class)")
    for verdict, count in sorted(totals.items()):
        print(f"  {count:3d} x {verdict}")
    budget = 3.0 * len(rows) if lab == "03" else None  # lab 03: 60 s for 20 students on 2 cores
    graded = wall - steps["merge (the reports)"][0]
    if budget:
        print(f"  lab 03's target: init and the shard under {budget:.0f} s ({graded:.0f} s)")
    return 0 if budget is None or graded < budget else 1


if __name__ == "__main__":
    sys.exit(main())
