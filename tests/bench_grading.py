"""Time the grader on a class: `python -m tests.bench_grading [--lab 03] [--students 20]`.

The class is made from the lab itself: a third copy the solution, a third the untouched student
lab, a third the solution with one answer cell reverted to the TODO. Prints the wall time and the
grades' totals, so a regression in the grader's speed or in its verdicts shows at once.
"""
import argparse
import collections
import csv
import pathlib
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


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lab", default="03")
    parser.add_argument("--students", type=int, default=20)
    parser.add_argument("--jobs", type=int, default=2)
    options = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        submissions = pathlib.Path(tmp) / "submissions"
        submissions.mkdir()
        make_class(options.lab, options.students, submissions)
        start = time.monotonic()
        grading.grade(options.lab, submissions, pathlib.Path(tmp) / "out", jobs=options.jobs)
        seconds = time.monotonic() - start
        with open(pathlib.Path(tmp) / "out" / "grades.csv") as f:
            rows = list(csv.DictReader(f))
    totals = collections.Counter(f"{r['total']}/{r['max']} {r['status']}" for r in rows)
    budget = 3.0 * len(rows)  # 60 s for 20 students on 2 cores
    print(f"lab {options.lab}: graded {len(rows)} submissions in {seconds:.0f} s "
          f"({seconds / len(rows):.1f} s each with 2 in parallel; target: under {budget:.0f} s)")
    for verdict, count in sorted(totals.items()):
        print(f"  {count:3d} x {verdict}")
    return 0 if seconds < budget else 1


if __name__ == "__main__":
    sys.exit(main())
