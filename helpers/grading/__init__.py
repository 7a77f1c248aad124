"""Grading: the public checks students run, and the instructor's grader, one folder per stage of a run.

  what students call  check (`check("3.2", globals())`), registry (public_check), shared_run (one multi-rank run
                      shared by a question's checks and probes), checks/labNN/ (the public checks)
  the hidden tests    probes/labNN.py (inputs from the run's secret seed, judges, refused shortcuts)
  prepare/            labgen (labs/ from solutions/), release (the student edition), submissions (read without
                      trust), assemble (the graded notebook), scope, answer_scan
  run/                sandbox (bwrap), cgroup, execute (cell by cell, with limits), grade_student (one
                      submission), probe_runtime (inside the kernel)
  judge/              plain (values as plain data, compared in the grader), replay (public checks replayed on the
                      probe values), reference (one mistake, one question), answer_errors (the student's own error)
  report/             report (grades.csv, cells.csv), feedback, returns, gradebook (LMS files), spreadsheet (safe
                      CSV), manual (the parts graded by hand), similarity, similarity_report
  the class run       grade (`make grade`), state (OUT/state.json), progress, shards (a class on many machines:
                      `make grade-init`, `make grade SHARD=k/N`, `make grade-merge`)
"""
import sys

from helpers.grading.check import CheckResult, check

__all__ = ["check", "CheckResult"]

# The grader reads notebooks with nbformat, which imports jsonschema, which imports rfc3987_syntax where it is
# installed (jupyter_events asks for it) and builds an Earley parser for IRIs at import: 2.6-3.1 s of CPU in each
# interpreter that imports the grading modules (the class grader, and its forkserver: measured 6.0 -> 3.4 s for
# `import helpers.grading.run.grade_student`), for a format nbformat never checks (it validates without a format
# checker). Without the module, jsonschema leaves "iri" unchecked. tests/warm_kernels.py does the same for pytest.
sys.modules.setdefault("rfc3987_syntax", None)
