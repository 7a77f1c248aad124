"""One OUT, one run (helpers/grading/state.start): what is refused, with its message, and what FRESH deletes."""
import json

import pytest

from helpers.grading.state import StateError, digest, probe_seed, start


def _run(out, submissions="subs"):
    """An OUT as a grading run leaves it."""
    for sub in ("results", "feedback", "executed", "return/ada"):
        (out / sub).mkdir(parents=True)
    (out / "results" / "ada.json").write_text("{}")
    (out / "gradebook-canvas.csv").write_text("old")
    (out / "state.json").write_text(json.dumps({"lab": "03", "seed": 7, "fingerprint": "f",
                                                "submissions": str(submissions.resolve()), "expected": {}}))


def test_a_new_or_empty_out_starts_a_run(tmp_path):
    state = start(tmp_path / "new", "03", "f", tmp_path / "subs")
    assert state["submissions"] == str((tmp_path / "subs").resolve()) and state["expected"] is None
    (tmp_path / "empty").mkdir()
    assert start(tmp_path / "empty", "03", "f", tmp_path / "subs")["lab"] == "03"


def test_what_is_refused_says_what_to_pass(tmp_path):
    (tmp_path / "file").write_text("x")
    with pytest.raises(StateError, match="is a file, not a folder: pass a new or empty folder"):
        start(tmp_path / "file", "03", "f", tmp_path)
    with pytest.raises(StateError, match="FRESH=1 .--fresh. deletes the run that RESUME=1 or ONLY= would continue"):
        start(tmp_path, "03", "f", tmp_path, fresh=True, only=True)
    out = tmp_path / "out"
    _run(out, tmp_path / "subs")
    with pytest.raises(StateError, match=r"holds an earlier grading run \(lab 03, SUBMISSIONS=.*subs, 1 result\(s\)\)"):
        start(out, "03", "f", tmp_path / "subs")
    assert start(out, "03", "f", tmp_path / "subs", resume=True)["seed"] == 7, "the seed is the run's"
    with pytest.raises(StateError, match="would mix two classes"):
        start(out, "03", "f", tmp_path / "other", only=True)
    with pytest.raises(StateError, match="was graded for lab 03, not lab 04: use another OUT"):
        start(out, "04", "f", tmp_path / "subs", resume=True)


def test_fresh_deletes_only_a_run_of_the_graders_own_files(tmp_path):
    out = tmp_path / "out"
    _run(out, tmp_path / "subs")
    (out / "notes.txt").write_text("mine")
    with pytest.raises(StateError, match=r"holds files the grader did not write \(notes.txt\); nothing was deleted"):
        start(out, "03", "f", tmp_path / "subs", fresh=True)
    assert (out / "results" / "ada.json").exists()
    (out / "notes.txt").unlink()
    state = start(out, "03", "f", tmp_path / "other", fresh=True)
    assert list(out.iterdir()) == [] and state["expected"] is None
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "todo.txt").write_text("x")
    with pytest.raises(StateError, match=r"is not empty \(todo.txt\) and holds no grading run"):
        start(tmp_path / "mine", "03", "f", tmp_path / "subs")


def test_a_replaced_submission_draws_inputs_of_its_own(tmp_path):
    # The run's seed serves the bytes it started with; other bytes (replaced after their feedback, or added) draw a
    # seed from the run's secret, the student and the bytes, the same each time (RESUME=1, ONLY=).
    subs = tmp_path / "subs"
    subs.mkdir()
    (subs / "ada.ipynb").write_bytes(b"first")
    (subs / "link.ipynb").symlink_to(subs / "ada.ipynb")  # never read
    state = start(tmp_path / "out", "03", "f", subs)
    assert state["students"] == {"ada": digest(b"first")} and len(state["secret"]) == 32
    seed, secret, first = state["seed"], state["secret"], state["students"]
    assert probe_seed(seed, secret, first, "ada", digest(b"first")) == seed
    replaced = probe_seed(seed, secret, first, "ada", digest(b"table"))
    assert replaced != seed and replaced == probe_seed(seed, secret, first, "ada", digest(b"table"))
    assert probe_seed(seed, secret, first, "bob", digest(b"table")) not in (seed, replaced)
    assert probe_seed(seed, secret, {}, "ada", digest(b"first")) != seed, "a run that recorded no bytes: their own"
    assert probe_seed(seed, secret, None, "ada", digest(b"table")) == seed, "no record asked for: the run's"
