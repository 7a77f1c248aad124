"""Grade one submission, in a process of its own, into OUT/results/<student>.json.

The class grader (grade.py) starts one such process per student from a forkserver that has this module
imported (nbclient and friends cost about 2.5 s to import; a fork costs milliseconds). Whatever the
submission does, this process writes its result or dies; the class grader turns a death into that
student's `grader_error` and goes on.
"""
import dataclasses
import json
import os
import pathlib
import tempfile
import time
import traceback

import nbformat

from helpers.grading import probes as probe_files
from helpers.grading import state as run_state
from helpers.grading.judge.answer_errors import failures
from helpers.grading.judge.redact import WITHHELD, Secrets
from helpers.grading.judge.reference import composition_notes
from helpers.grading.prepare.assemble import answer_sources, assemble, probe_values
from helpers.grading.prepare.scope import outside_names
from helpers.grading.prepare.submissions import SubmissionError, read_bytes, read_notebook
from helpers.grading.probes.shortcuts import refusal, unreadable
from helpers.grading.report import manual
from helpers.grading.run.cgroup import limit_this_process
from helpers.grading.run.execute import execute
from helpers.grading.run.probe_runtime import MESSAGE_CHARS


@dataclasses.dataclass
class Task:
    """Everything a student's grading needs; the same for the whole class but for the submission."""

    lab: str
    released: object  # the released lab notebook
    probes_dir: str  # None: the course's own probes
    expected: dict  # {question: {probe name: {"value": ...}}} from the solution
    seed: int
    out: str
    limits: object
    references: dict = None  # {question: the solution's earlier answers its probes call} (reference.py)
    # A student's own probe seed (state.probe_seed): the run's secret, and the bytes the run started with ({student:
    # sha256}; None: every student on `seed`); the solution, whose values a student on a seed of their own needs.
    secret: str = ""
    first: dict = None
    solution: object = None


def run_one(released, submission, setup, probes, seed, workdir, limits, references=None):
    """Execute one submission; return (executed notebook, Execution, {question: probe values}, missing)."""
    graded, nonces, missing = assemble(released, submission, setup, probes, seed, references)
    execution = execute(graded, workdir, limits)
    values = {q: probe_values(graded, q, nonce, execution.records) for q, nonce in nonces.items()}
    return graded, execution, values, missing


class SolutionFailed(RuntimeError):
    """The solution does not pass its own probes for a seed; the message says which."""


def solution_values(released, solution, setup, probes, seed, limits, references=None):
    """The solution's probe values for this seed; SolutionFailed unless every probe succeeds on it."""
    with tempfile.TemporaryDirectory(prefix="grade-solution-") as workdir:
        os.chmod(workdir, 0o755)
        _, execution, values, missing = run_one(released, solution, setup, probes, seed, workdir, limits, references)
    failed = [p.name for p in probes if "value" not in values.get(p.question, {}).get(p.name, {})]
    if missing or failed:
        raise SolutionFailed(f"the solution does not pass its own probes ({missing or failed}; status "
                             f"{execution.status}): fix the probes or the solution before grading")
    return values


def score(probes, expected, values, sources, seed, secrets=None):
    """{question: [mark dict]} for each probe: its name, points, points earned and why.

    secrets: what no message may hold (redact.Secrets: the probe cells' text, the SETUP, the references' sources,
    the seeds); a message the student's code raised on the probe's inputs is shown with its numbers masked."""
    secrets = secrets or Secrets()
    marks = {}
    for probe in probes:
        got = values.get(probe.question, {}).get(probe.name)
        unread = unreadable(sources.get(probe.question, ""))
        mark = {"name": probe.name, "points": probe.points, "earned": 0.0}
        if unread:  # said first: a probe's own error would hide why
            mark["message"] = unread
        elif got is None:
            mark["message"] = "did not run (an earlier cell failed, timed out or killed the kernel)"
        elif "error" in got and (got.get("run_failed") and probe.hint or _meaning(probe, got["error"])):
            # a hang, a dead rank, an error the check explains: what the public check says of it
            said = _meaning(probe, got["error"]) or probe.hint
            mark["message"] = f"the ranks did not finish together: {said.strip()}"
        elif "error" in got:  # the student's own text (an exception's name and message): quoted in the feedback
            mark.update(message=str(got["error"])[:MESSAGE_CHARS], quoted=not got.get("grader"))
            reached = refusal(sources.get(probe.question, ""), ()) if mark["quoted"] else ""
            if reached:  # it read In, frames, the grader's code: why it scores 0, and nothing it raised
                mark.update(message=reached, quoted=False)
            elif mark["quoted"]:
                mark["message"] = secrets.quoted(mark["message"])
                mark["quoted"] = mark["message"] != WITHHELD
        else:
            ok, mark["message"] = probe.grade(expected[probe.question][probe.name]["value"], got["value"],
                                              answer_source=sources.get(probe.question, ""), seed=seed)
            mark["earned"] = probe.points if ok else 0.0
        if not mark.get("quoted"):  # a check's line quoting an answer, a value the student returned
            mark["message"] = secrets.said(mark["message"])
        if got is not None and "own" in got:  # the probes ran again with the student's own earlier answers (info)
            mark["own"] = "value" in got["own"] and probe.grade(
                expected[probe.question][probe.name]["value"], got["own"]["value"],
                answer_source=sources.get(probe.question, ""), seed=seed)[0]
        marks.setdefault(probe.question, []).append(mark)
    return marks


def _meaning(probe, error):
    """What the public check says of this error (Probe.errors), or None."""
    return next((meaning for text, meaning in probe.errors if text in str(error)), None)


def zero_marks(probes, message):
    """Every probe failed for one reason (the notebook could not be read, grading crashed)."""
    marks = {}
    for p in probes:
        marks.setdefault(p.question, []).append({"name": p.name, "points": p.points, "earned": 0.0, "message": message})
    return marks


def result_path(out, student):
    return pathlib.Path(out) / "results" / f"{student}.json"


def write_result(out, result):
    """Write atomically: a crash never leaves half a result that --resume would trust."""
    path = result_path(out, result["student"])
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(result))
    os.replace(tmp, path)


def memory_limit_result(student, probes, grow_bytes):
    """The `memory_limit` result of a submission whose grading passed its memory limit: every probe 0."""
    why = MEMORY_LIMIT.format(grow_bytes // 2**20)
    return {"student": student, "status": "memory_limit", "missing": [], "cells": [], "kernels": 0,
            "marks": zero_marks(probes, why), "error": why}


def refused_result(student, probes, why):
    """The `error` result of a submission that could not be read: why is said in the feedback, every probe 0."""
    return {"student": student, "status": "error", "missing": [], "cells": [], "kernels": 0,
            "marks": zero_marks(probes, "the notebook could not be read"), "error": why}


def failed_result(out, student, probes, exc):
    """The `error` result of a notebook whose grading raised: every probe 0, the exception's class in the feedback,
    its traceback in OUT/logs/grader.log (where a grader's own bug shows). Before, the process died: grader_error and
    a blank LMS grade on every re-grade, for what a student's notebook made the grader raise."""
    why = (f"grading this notebook raised {type(exc).__name__} in the grader, so every question scores 0: ask your "
           "instructor (the grader's log has the details)")
    with open(pathlib.Path(out) / "logs" / "grader.log", "a", encoding="utf-8", errors="replace") as log:
        log.write(f"{student}: grading raised\n{''.join(traceback.format_exception(exc))}")
    return {"student": student, "status": "error", "missing": [], "cells": [], "kernels": 0,
            "marks": zero_marks(probes, why), "error": why}


# A grading process that passed its memory limit (Limits.grader_memory_bytes: an answer that printed or displayed
# gigabytes, which reach this process as messages before any cap can cut them).
MEMORY_LIMIT = ("grading this notebook took more than {} MiB of the grader's memory (an output of hundreds of "
                "megabytes?), so it was stopped: print less")


def grade_student(task, student, path):
    """Grade one student and write the result; returns it."""
    start = time.monotonic()
    limit_this_process(task.limits.grader_memory_bytes, task.limits.fences.memory_cgroups)
    setup, probes = probe_files.load(task.lab, task.probes_dir)
    try:
        sha256 = run_state.digest(read_bytes(path))  # which inputs: the run's for the bytes it started with
        submission = read_notebook(path)  # a regular file only, capped; its messages quote nothing of it
    except Exception as exc:  # noqa: BLE001 - any unreadable file is the student's problem
        why = str(exc) if isinstance(exc, SubmissionError) else f"not a readable notebook ({type(exc).__name__})"
        result = refused_result(student, probes, why)
    else:
        seed = run_state.probe_seed(task.seed, task.secret, task.first, student, sha256)
        try:
            result = {**_graded(task, student, submission, setup, probes, seed), "sha256": sha256, "probe_seed": seed}
        except MemoryError:  # RLIMIT_AS, where no memory cgroup holds this process (cgroup.limit_this_process)
            result = memory_limit_result(student, probes, task.limits.grader_memory_bytes)
        except SolutionFailed:  # the solution on this student's inputs: the grader's to fix, a grader_error
            raise
        except Exception as exc:  # noqa: BLE001 - what grading this notebook raised is this student's (issue 29)
            result = {**failed_result(task.out, student, probes, exc), "sha256": sha256, "probe_seed": seed}
    result["seconds"] = round(time.monotonic() - start, 1)
    write_result(task.out, result)
    return result


def _graded(task, student, submission, setup, probes, seed):
    # Bytes the run did not start with: their own inputs, judged against the solution's values for them.
    expected = task.expected if seed == task.seed else solution_values(
        task.released, task.solution, setup, probes, seed, task.limits, task.references)
    limits = dataclasses.replace(task.limits, log_path=str(pathlib.Path(task.out) / "logs" / f"{student}.log"))
    with tempfile.TemporaryDirectory(prefix="grade-") as workdir:  # short: unix socket paths live in it
        os.chmod(workdir, 0o755)
        graded, execution, values, missing = run_one(task.released, submission, setup, probes, seed,
                                                     workdir, limits, task.references)
    code = (setup, *(r["source"] for r in (task.references or {}).values()))
    secrets = Secrets.of_notebook(graded, seeds=(task.seed, seed), code=code)
    marks = score(probes, expected, values, answer_sources(graded), seed, secrets)
    composition = composition_notes(marks, task.references or {})
    status = "missing" if len(missing) == len({p.question for p in probes}) else execution.status
    nbformat.write(graded, pathlib.Path(task.out) / "executed" / f"{student}.ipynb")
    hand = manual.texts(task.released, submission, probe_files.load_manual(task.lab, task.probes_dir))
    return {"student": student, "marks": marks, "status": status, "missing": missing,
            "cells": execution.cells, "kernels": execution.kernels,
            "outside": outside_names(task.released, submission), "manual": hand, "composition": composition,
            "cell_errors": failures(graded, execution.cells, secrets)}
