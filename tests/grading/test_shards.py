"""A class graded in 2 shards and merged is the class graded at once (helpers/grading/shards.py); what sharding refuses.

The smallest class that shows it: lab 97 (tests/grading/fixture_lab.py), 4 students, one kernel in each shard
(ada: right, bo: 97.2 wrong) and one that starts none (cy: nothing answered, dee: not a notebook). Graded twice, in
shards and at once from the same state: the solution once and 4 kernels in all."""
import csv
import datetime
import json
import os
import shutil
import subprocess

import pytest

from helpers.grading import grade as grading
from helpers.grading import shards
from helpers.grading import state as run_state
from helpers.grading.prepare.labgen import ROOT
from tests.grading import fixture_lab as lab

pytestmark = pytest.mark.timeout(300)

WRONG_SUM = "from helpers import launch\ndef rank_sum(world_size):\n    return 0.0\n"
CLASS = {"ada": (lab.ADD, lab.RANK_SUM), "bo": (lab.ADD, WRONG_SUM), "cy": (None, None)}  # + dee, not a notebook
OPTIONS = grading.Options(format="canvas", assignment="Lab 97 (4242)", deadline="2026-11-20T23:00+00:00")
SUBMITTED = {"bo": "2026-11-21T13:59:00+00:00"}  # 15 h late; the others on time
TIMING = {"seconds"}  # grades.csv's columns that differ from run to run


def _class(root):
    lab.build(root)
    for student, (add, rank_sum) in CLASS.items():
        lab.submission(root, student, add, rank_sum)
    (root / "submissions" / "dee.ipynb").write_text("{ not a notebook")
    for path in (root / "submissions").iterdir():
        stamp = datetime.datetime.fromisoformat(SUBMITTED.get(path.stem, "2026-11-20T22:00:00+00:00")).timestamp()
        os.utime(path, (stamp, stamp))


def _options(root):
    return dict(probes_dir=root / "probes", labs_dir=root / "labs", solutions_dir=root / "solutions")


def _limits(root, out):
    limits = grading.default_limits([root / "probes", root / "solutions", root / "submissions", out])
    limits.cell_seconds, limits.total_seconds = 30.0, 90.0
    return limits


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """(root, the sharded OUT, the single run's OUT, what the merge said before shard 2 ran)."""
    root = tmp_path_factory.mktemp("shards")
    _class(root)
    out, single = root / "sharded", root / "single"
    grading.grade("97", root / "submissions", out, init=True, options=OPTIONS, limits=_limits(root, out),
                  **_options(root))
    grading.grade("97", root / "submissions", out, shard=(1, 2), limits=_limits(root, out), **_options(root))
    with pytest.raises(run_state.StateError) as incomplete:
        shards.merge(out, **_options(root))
    grading.grade("97", root / "submissions", out, shard=(2, 2), limits=_limits(root, out), **_options(root))
    shards.merge(out, **_options(root))
    # The same class graded at once with the same state (seed, the solution's values, options): RESUME of an OUT
    # that holds init's state.json and no result grades every student.
    single.mkdir()
    shutil.copy(out / "state.json", single)
    grading.grade("97", root / "submissions", single, resume=True, limits=_limits(root, single), **_options(root))
    return root, out, single, str(incomplete.value)


def _rows(out):
    with open(out / "grades.csv") as f:
        return [{k: v for k, v in row.items() if k not in TIMING} for row in csv.DictReader(f)]


def _files(folder):
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_the_merge_equals_the_single_run(runs):
    _, out, single, _ = runs
    rows = _rows(out)
    assert rows == _rows(single)
    got = {r["student"]: (r["97.1"], r["97.2"], r["status"], r["final"]) for r in rows}
    assert got == {"ada": ("2", "2", "ok", "4"), "bo": ("2", "0", "ok", "1.8"), "cy": ("0", "0", "ok", "0"),
                   "dee": ("0", "0", "error", "0")}, got
    assert _files(out / "feedback") == _files(single / "feedback") and len(_files(out / "feedback")) == 4
    assert (out / "gradebook-canvas.csv").read_bytes() == (single / "gradebook-canvas.csv").read_bytes()
    assert (out / "similarity.md").read_text() == (single / "similarity.md").read_text()
    assert _files(out / "return").keys() == _files(single / "return").keys()
    assert sorted(p.name for p in (out / "executed").iterdir()) == \
        sorted(p.name for p in (single / "executed").iterdir())


def test_merging_again_changes_nothing(runs, capsys):
    # make grade-merge's command, run again (after a shard re-graded someone, or the points of a part graded by hand)
    root, out, single, _ = runs
    feedback = _files(out / "feedback")
    assert shards.main(["--out", str(out), "--probes", str(root / "probes"), "--solutions", str(root / "solutions"),
                        "--labs", str(root / "labs")]) == 0
    said = capsys.readouterr().out
    assert said.startswith(f"merged 4 students into {out}/grades.csv") and f"wrote {out}/gradebook-canvas.csv" in said
    assert _rows(out) == _rows(single) and _files(out / "feedback") == feedback


def test_each_shard_grades_its_slice_into_its_own_folder(runs):
    _, out, _, _ = runs
    for k, mine in ((1, ["ada", "cy"]), (2, ["bo", "dee"])):
        folder = out / "shards" / f"{k}-of-2"
        assert sorted(p.stem for p in (folder / "results").iterdir()) == mine
        assert json.loads((folder / "shard.json").read_text())["students"] == mine
        assert [shards.slice_of(s, 2) for s in mine] == [k, k]


def test_merging_incomplete_shards_names_the_missing_students(runs):
    _, _, _, said = runs
    assert said.startswith("2 of 4 students have no result yet: bo (shard 2/2), dee (shard 2/2): run make grade ... "
                           "SHARD=2/2"), said


def test_a_shard_run_again_grades_only_what_has_no_result(runs):
    # A requeued SLURM task or a restarted pod runs the same command: nothing is graded twice.
    root, out, _, _ = runs
    again = grading.grade("97", root / "submissions", out, shard=(2, 2), limits=_limits(root, out), **_options(root))
    assert again.graded == [] and [r["student"] for r in again] == ["bo", "dee"]
    assert "graded 0 submissions of shard 2/2" in again.notes[0] and "make grade-merge" in again.notes[0]


def test_shard_refusals(runs, capsys):
    root, out, _, _ = runs
    args = ["--lab", "97", "--submissions", str(root / "submissions"), "--out", str(out), "--probes",
            str(root / "probes"), "--solutions", str(root / "solutions"), "--labs", str(root / "labs")]
    for shard, said in (("3/2", "SHARD=3/2: k counts the slices from 1 to N, so pass 1/2 to 2/2"),
                        ("0/2", "SHARD=0/2: k counts the slices from 1 to N"),
                        ("two", "SHARD=two: pass k/N, the k-th of N slices of the class, e.g. SHARD=2/4")):
        assert grading.main([*args, "--shard", shard]) == 2
        assert said in capsys.readouterr().err
    assert grading.main([*args, "--shard", "1/2", "--format", "csv"]) == 2
    assert "FORMAT belong to the whole class: pass them to make grade-init" in capsys.readouterr().err
    assert grading.main([*args, "--shard", "1/2", "--fresh"]) == 2
    assert "make grade-init ... FRESH=1, then every shard" in capsys.readouterr().err
    assert grading.main([*args, "--init", "--shard", "1/2"]) == 2
    assert "--init (make grade-init) writes a new run's state" in capsys.readouterr().err
    assert grading.main([*args, "--shard", "1/3"]) == 2
    assert "holds slices of another split (1-of-2, 2-of-2)" in capsys.readouterr().err
    with pytest.raises(grading.GradingError, match="SHARD=1/2: ONLY=bo nobody: bo is in shard 2/2; nobody has no "
                                                   "submission"):
        grading.grade("97", root / "submissions", out, shard=(1, 2), only=["bo", "nobody"], **_options(root))
    with pytest.raises(run_state.StateError, match="holds no run to grade a slice of: run make grade-init LAB=97"):
        grading.grade("97", root / "submissions", root / "nowhere", shard=(1, 2), **_options(root))


def test_a_mismatched_state_is_refused(runs, tmp_path):
    # Init run again (a new seed, a new run id) after the shards graded: their results belong to another run.
    root, out, _, _ = runs
    moved = tmp_path / "out"
    shutil.copytree(out, moved)
    state = json.loads((moved / "state.json").read_text())
    (moved / "state.json").write_text(json.dumps({**state, "seed": state["seed"] + 1, "run": "another"}))
    with pytest.raises(run_state.StateError, match=r"shards/1-of-2 was graded with another run's state .* delete it "
                                                   r"and run make grade ... SHARD=1/2 again"):
        shards.merge(moved, **_options(root))
    with pytest.raises(run_state.StateError, match="holds results graded with another run's state"):
        grading.grade("97", root / "submissions", moved, shard=(1, 2), **_options(root))
    (moved / "state.json").write_text(json.dumps({**state, "fingerprint": "another lab"}))
    with pytest.raises(run_state.StateError, match="the lab, its solution or its probes are not the ones make "
                                                   "grade-init graded with: pass init's PROBES= and SOLUTIONS="):
        shards.merge(moved, **_options(root))
    other = tmp_path / "elsewhere"
    shutil.copytree(root / "submissions", other)
    (moved / "state.json").write_text(json.dumps(state))
    with pytest.raises(run_state.StateError, match="every shard grades the folder init was given, at the same path"):
        grading.grade("97", other, moved, shard=(1, 2), **_options(root))


def test_a_students_slice_depends_on_their_id_alone():
    ids = [f"s{i:04d}" for i in range(1000)]
    assert [shards.slice_of(s, 8) for s in ids] == [shards.slice_of(s, 8) for s in reversed(ids)][::-1]
    sizes = sorted(sum(shards.slice_of(s, 8) == k for s in ids) for k in range(1, 9))
    assert (sizes[0], sizes[-1]) == (114, 139), sizes  # 125 on average: GRADING.md states the spread


NO_SETUP = ("-o", "setup", "-o", ".venv/.installed")


def _make(*args):
    dry = subprocess.run(["make", "-n", "-s", *NO_SETUP, *args], cwd=ROOT, capture_output=True, text=True, check=True)
    return " ".join(dry.stdout.replace("\\\n", " ").split())


def test_make_passes_shard_init_and_merge():
    assert "-m helpers.grading.grade --init --lab '03' --submissions 's' --out 'o'" in _make(
        "grade-init", "LAB=03", "SUBMISSIONS=s", "OUT=o")
    assert "--shard '2/4'" in _make("grade", "LAB=03", "SUBMISSIONS=s", "OUT=o", "SHARD=2/4")
    assert "-m helpers.grading.shards --out 'o' --format 'canvas'" in _make("grade-merge", "OUT=o", "FORMAT=canvas")


def test_the_slurm_array_and_the_indexed_job_run_every_shard():
    # Each task's command, with make replaced by echo: the SLURM array's task ids 1..N (N its size, or SHARDS for one
    # task run again) and the Indexed Job's completion indexes 0..N-1 both become SHARD=1/N .. N/N.
    sbatch = (ROOT / "scripts" / "grading" / "grade_shards.sbatch").read_text()
    sbatch = sbatch.replace("\nmake grade", "\necho make grade")

    def slurm(task, **env):
        env = {**os.environ, "SLURM_ARRAY_TASK_ID": str(task), "LAB": "03", "SUBMISSIONS": "/c/s", "OUT": "/c/o", **env}
        said = subprocess.run(["bash", "-c", sbatch], env=env, capture_output=True, text=True, check=True).stdout
        return [w for w in said.split() if w.startswith(("SHARD=", "JOBS="))]

    assert [slurm(k, SLURM_ARRAY_TASK_COUNT="3") for k in (1, 2, 3)] == [[f"SHARD={k}/3", "JOBS=2"] for k in (1, 2, 3)]
    assert slurm(3, SLURM_ARRAY_TASK_COUNT="1", SHARDS="8", SLURM_CPUS_PER_TASK="8") == ["SHARD=3/8", "JOBS=8"]
    yaml = pytest.importorskip("yaml")
    job = yaml.safe_load((ROOT / "scripts" / "grading" / "grade_shards_job.yaml").read_text())
    spec = job["spec"]
    assert (job["kind"], spec["completionMode"]) == ("Job", "Indexed") and spec["completions"] == spec["parallelism"]
    container = spec["template"]["spec"]["containers"][0]
    env = {e["name"]: e["value"] for e in container["env"]}
    assert env["SHARDS"] == str(spec["completions"]) and container["command"][:2] == ["bash", "-c"]
    script = container["command"][2].replace("exec make", "echo make")
    said = [subprocess.run(["bash", "-c", script], env={**os.environ, **env, "JOB_COMPLETION_INDEX": str(i)},
                           capture_output=True, text=True, check=True).stdout.split()
            for i in range(spec["completions"])]
    assert [[w for w in words if w.startswith("SHARD=")] for words in said] == [[f"SHARD={k}/8"] for k in range(1, 9)]
