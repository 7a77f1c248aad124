"""An earlier grading run's OUT inside the repository is hidden from graded kernels, and so is artifacts/.

The red team's late_thief (a5) imported a classmate's executed answers from such an OUT (7/7), and could read its
state.json (the run's seed and expected values). Checked on the bubblewrap argument list (no kernel)."""
import json

from helpers.grading.grade import default_limits
from helpers.grading.run.sandbox import bwrap_argv, grading_runs


def _hidden(argv):
    return {argv[i + 1] for i, arg in enumerate(argv[:-1]) if arg == "--tmpfs"}


def _repo(tmp_path):
    repo = tmp_path / "repo"
    old = repo / "labs" / "grades-2025"  # an instructor's OUT, anywhere in the repository
    for sub in ("executed", "results", "feedback"):
        (old / sub).mkdir(parents=True)
    (old / "state.json").write_text(json.dumps({"lab": "01", "seed": 7, "fingerprint": "f", "expected": {}}))
    copied = repo / "backup" / "run"  # a copy without its state.json: the grader's layout still tells
    for sub in ("executed", "results", "feedback"):
        (copied / sub).mkdir(parents=True)
    (repo / "artifacts" / "gpu-check").mkdir(parents=True)
    (repo / "chapters").mkdir()
    (repo / "chapters" / "state.json").write_text('{"not": "a run"}')  # a file of that name alone is not a run
    return repo, old, copied


def test_earlier_runs_and_artifacts_are_hidden_from_the_kernel(tmp_path):
    repo, old, copied = _repo(tmp_path)
    work = tmp_path / "w"
    limits = default_limits([], root=repo)
    hidden = _hidden(bwrap_argv(str(work), limits.readonly_dirs, limits.hidden_dirs))
    assert {str(old), str(copied), str(repo / "artifacts")} <= hidden, hidden
    assert str(repo / "chapters") not in hidden and str(repo) not in hidden


def test_the_search_skips_the_python_installation(tmp_path):
    repo, old, _ = _repo(tmp_path)
    venv = repo / ".venv" / "lib" / "run"
    venv.mkdir(parents=True)
    (venv / "state.json").write_text(json.dumps({"lab": "01", "seed": 7, "fingerprint": "f"}))
    assert str(venv) not in grading_runs(repo, skip=[repo / ".venv"]) and str(old) in grading_runs(repo)
