"""What a grading run keeps in OUT/state.json so that --resume and --only grade like the first run did.

    {"lab": "03", "seed": <secret probe seed>, "secret": <secret of the students' own seeds>,
     "fingerprint": <sha256 of lab, solution and probes>, "submissions": <the SUBMISSIONS folder, resolved>,
     "students": {student: <sha256 of the submission the run started with>},
     "options": {the LMS file and late policy chosen}, "expected": {question: {probe: {"value": ...}}}}

OUT is hidden from graded kernels, so the seed stays secret while the class is graded. The bytes in `students` are
graded on the run's seed (one solution run serves the class); any other bytes (a submission replaced after its
feedback went out, or one added later) on a seed of their own, drawn from `secret`, the student and the bytes'
sha256 (probe_seed), against the solution's values for it, computed for that student: so RESUME=1 and ONLY= reuse a
student's inputs only for the same bytes. results/<student>.json records the sha256 and seed each was graded with.

One OUT holds one run (`start`): a command without --resume, --only or --fresh refuses an OUT that holds anything,
saying what each would do; --resume and --only continue the run recorded there, from the same SUBMISSIONS folder (two
classes never mix in one grades.csv); --fresh deletes what the grader wrote there (RUN_FILES) and starts anew, and
refuses if OUT holds a file the grader did not write.
"""
import hashlib
import json
import os
import pathlib
import secrets
import shutil


class StateError(RuntimeError):
    """OUT holds no run that --resume or --only could continue; the message says what to do."""


def fingerprint(*paths):
    """sha256 over the files that decide the expected values (released lab, solution, probes)."""
    digest = hashlib.sha256()
    for path in paths:
        digest.update(pathlib.Path(path).read_bytes())
    return digest.hexdigest()


def _path(out):
    return pathlib.Path(out) / "state.json"


# What a grading run writes in OUT (grade.py, report.py, manual.py, returns.py, similarity_report.py, the LMS file,
# shards.py).
RUN_FILES = ("state.json", "state.tmp", "grades.csv", "cells.csv", "manual.csv", "similarity.md", "similarity.csv",
             "executed", "feedback", "results", "logs", "manual", "return", "shards")  # shards/: shards.py
RUN_GLOBS = ("gradebook-*.csv",)


def _ours(path):
    return path.name in RUN_FILES or any(path.match(pattern) for pattern in RUN_GLOBS)


def describe(out):
    """'lab 03 from SUBMISSIONS=dir, 6 results' of the run in OUT, as far as its files tell."""
    out = pathlib.Path(out)
    try:
        state = json.loads(_path(out).read_text())
    except (OSError, ValueError):
        state = {}
    results = len(list((out / "results").glob("*.json"))) if (out / "results").is_dir() else 0
    parts = [f"lab {state['lab']}" if state.get("lab") else "",
             f"SUBMISSIONS={state['submissions']}" if state.get("submissions") else "", f"{results} result(s)"]
    return ", ".join(p for p in parts if p)


def start(out, lab, fingerprint, submissions, *, resume=False, only=False, fresh=False):
    """The run to grade into OUT: a new one (new seed) in an empty OUT or with fresh, else the one recorded there.

    Raises StateError, with what to pass instead, before anything in OUT is changed."""
    out, submissions = pathlib.Path(out), str(pathlib.Path(submissions).resolve())
    if fresh and (resume or only):
        raise StateError("FRESH=1 (--fresh) deletes the run that RESUME=1 or ONLY= would continue: pass one of them")
    if out.exists() and not out.is_dir():
        raise StateError(f"OUT={out} is a file, not a folder: pass a new or empty folder as OUT")
    if resume or only:
        return _continued(out, lab, fingerprint, submissions)
    entries = sorted(out.iterdir()) if out.is_dir() else []
    foreign = [p.name for p in entries if not _ours(p)]
    if entries and not fresh:
        if foreign and len(foreign) == len(entries):
            raise StateError(f"OUT={out} is not empty ({', '.join(foreign[:3])}{', ...' if len(foreign) > 3 else ''}) "
                             "and holds no grading run: pass a new or empty folder as OUT")
        raise StateError(f"OUT={out} holds an earlier grading run ({describe(out)}): pass RESUME=1 (--resume) to "
                         "finish it, ONLY=ids (--only) to re-grade some students, FRESH=1 (--fresh) to delete it and "
                         "grade anew, or another OUT")
    if foreign:
        raise StateError(f"FRESH=1: OUT={out} also holds files the grader did not write ({', '.join(foreign[:3])}"
                         f"{', ...' if len(foreign) > 3 else ''}); nothing was deleted: move them, or pass another OUT")
    for path in entries:  # fresh: every file of the earlier run goes
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink()
    return {"lab": lab, "seed": secrets.randbelow(2**31), "secret": secrets.token_hex(16), "fingerprint": fingerprint,
            "submissions": submissions, "options": {}, "expected": None, "students": digests(submissions)}


def _continued(out, lab, fingerprint, submissions):
    state = load_or_start(out, lab, fingerprint, fresh=False)
    earlier = state.get("submissions")
    if earlier is not None and earlier != submissions:
        raise StateError(f"OUT={out} holds the run of SUBMISSIONS={earlier}, not {submissions}: grading another "
                         "folder into it would mix two classes; pass that SUBMISSIONS, or FRESH=1 (--fresh) to grade "
                         "this one anew (deletes the earlier run), or another OUT")
    return {**state, "submissions": submissions}


def load_or_start(out, lab, fingerprint, *, fresh):
    """A new run (new seed) when fresh, else the run recorded in OUT, checked against lab and fingerprint."""
    if fresh:
        return {"lab": lab, "seed": secrets.randbelow(2**31), "secret": secrets.token_hex(16),
                "fingerprint": fingerprint, "expected": None}
    try:
        state = json.loads(_path(out).read_text())
    except (OSError, ValueError) as exc:
        raise StateError(f"{out} holds no earlier grading run to continue ({exc.__class__.__name__}): "
                         "grade without RESUME=1/ONLY= (--resume/--only) first") from None
    if state.get("lab") != lab:
        raise StateError(f"{out} was graded for lab {state.get('lab')}, not lab {lab}: use another OUT")
    if state.get("fingerprint") != fingerprint:
        raise StateError(f"the lab, its solution or its probes changed since {out} was graded: "
                         "grade the whole class again, with FRESH=1 (--fresh) or into a new OUT")
    return state


def save(out, state):
    """Write atomically: a power cut leaves the old state or the new one."""
    tmp = _path(out).with_suffix(".tmp")
    tmp.write_text(json.dumps(state))
    os.replace(tmp, _path(out))


def digest(data):
    """The sha256 of a submission's bytes: what decides whether a re-grade draws new probe inputs (probe_seed)."""
    return hashlib.sha256(data).hexdigest()


def digests(folder):
    """{student: digest} of every regular file SUBMISSIONS/<student>.ipynb a run starts with (unreadable ones left out).

    Read when the run starts, before any feedback goes out: these bytes share the run's seed (probe_seed)."""
    from helpers.grading.prepare.submissions import SubmissionError, listing, read_bytes

    found = {}
    if not pathlib.Path(folder).is_dir():
        return found
    for student, path in listing(folder)[0].items():
        try:
            found[student] = digest(read_bytes(path))
        except SubmissionError:
            pass
    return found


def probe_seed(seed, secret, first, student, sha256):
    """The secret seed of this student's probe inputs: the run's for the bytes the run started with (first: {student:
    digest}), else one drawn from the run's secret, the student and these bytes.

    A submission replaced after its feedback went out (which may have quoted its inputs) is graded on inputs of its
    own, whatever ONLY= or RESUME=1 re-grades it; the same bytes always get the same inputs."""
    if first is None or first.get(student) == sha256:
        return seed
    drawn = hashlib.sha256(f"{secret or seed}/{student}/{sha256}".encode()).digest()
    return int.from_bytes(drawn[:4], "big") % 2**31
