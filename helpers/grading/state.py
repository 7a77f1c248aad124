"""What a grading run keeps in OUT/state.json so that --resume and --only grade like the first run did.

    {"lab": "03", "seed": <secret probe seed>, "fingerprint": <sha256 of lab, solution and probes>,
     "expected": {question: {probe: {"value": ...}}}}

OUT is hidden from graded kernels, so the seed stays secret while the class is graded.
"""
import hashlib
import json
import os
import pathlib
import secrets


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


def load_or_start(out, lab, fingerprint, *, fresh):
    """A new run (new seed) when fresh, else the run recorded in OUT, checked against lab and fingerprint."""
    if fresh:
        return {"lab": lab, "seed": secrets.randbelow(2**31), "fingerprint": fingerprint, "expected": None}
    try:
        state = json.loads(_path(out).read_text())
    except (OSError, ValueError) as exc:
        raise StateError(f"{out} holds no earlier grading run to continue ({exc.__class__.__name__}): "
                         "grade without --resume/--only first") from None
    if state.get("lab") != lab:
        raise StateError(f"{out} was graded for lab {state.get('lab')}, not lab {lab}: use another OUT")
    if state.get("fingerprint") != fingerprint:
        raise StateError(f"the lab, its solution or its probes changed since {out} was graded: "
                         "grade the whole class again into a new OUT")
    return state


def save(out, state):
    """Write atomically: a power cut leaves the old state or the new one."""
    tmp = _path(out).with_suffix(".tmp")
    tmp.write_text(json.dumps(state))
    os.replace(tmp, _path(out))
