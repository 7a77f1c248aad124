"""A class too big for one machine: N shards graded anywhere, one merge.

    make grade-init  LAB=03 SUBMISSIONS=dir OUT=dir [PROBES=...] [FORMAT=... DEADLINE=...]   once
    make grade       LAB=03 SUBMISSIONS=dir OUT=dir SHARD=k/N [JOBS=...]                      k = 1..N, anywhere
    make grade-merge OUT=dir [FORMAT=...]                                                     once, at the end

  init     reads the lab, its solution and probes; writes OUT/state.json: the run's secret seed, the solution's
           probe values, the options, a run id (`python -m helpers.grading.grade --init`)
  shard    reads OUT/state.json; writes OUT/shards/k-of-N/: shard.json (the run id), results/, executed/ and logs/
           of its slice (`python -m helpers.grading.grade --shard k/N`)
  merge    reads OUT/state.json and every OUT/shards/k-of-N/; writes what one run writes: grades.csv, feedback/,
           cells.csv, the LMS file, return/, similarity.md (`python -m helpers.grading.shards --out OUT`)

A student's slice is sha256(id) mod N, plus 1: it depends on the id and N only, never on the other files in
SUBMISSIONS or the order a disk lists them. Every shard needs the same lab, solution, probes and SUBMISSIONS path as
init (the fingerprint and the path in state.json), and OUT on a file system every machine sees; a shard writes only
its own folder, so they run at once. A shard run again (a requeued SLURM task, a restarted pod) grades only its
students without a trusted result, as RESUME=1 does. The merge refuses while a student has no result, naming them
and their shard, and writes the reports with grade.report_class, the code a run on one machine uses: the same
grades.csv, feedback, LMS file and returns, and the similarity report over the whole class.
"""
import argparse
import dataclasses
import datetime
import hashlib
import json
import pathlib
import shutil
import sys

import nbformat

from helpers.grading import grade as grading
from helpers.grading import probes as probe_files
from helpers.grading import state as run_state
from helpers.grading.prepare import submissions
from helpers.grading.report.report import load_results
from helpers.grading.run.grade_student import result_path

SHARDS = "shards"  # OUT/shards/<k>-of-<N>/


def parse_shard(text):
    """(k, n) from 'k/N', 1 <= k <= N; raises ValueError naming what to pass."""
    try:
        k, n = (int(part) for part in str(text).split("/"))
    except ValueError:
        raise ValueError(f"SHARD={text}: pass k/N, the k-th of N slices of the class, e.g. SHARD=2/4") from None
    if n < 1 or not 1 <= k <= n:
        raise ValueError(f"SHARD={text}: k counts the slices from 1 to N, so pass 1/{max(n, 1)} to {max(n, 1)}/"
                         f"{max(n, 1)}")
    return k, n


def slice_of(student, n):
    """The slice, 1..n, that grades this student: sha256 of the id, whatever else SUBMISSIONS holds."""
    return int.from_bytes(hashlib.sha256(student.encode("utf-8")).digest()[:8], "big") % n + 1


def folder(out, k, n):
    return pathlib.Path(out) / SHARDS / f"{k}-of-{n}"


def _marker(path):
    try:
        return json.loads((pathlib.Path(path) / "shard.json").read_text())
    except (OSError, ValueError):
        return None


def _splits(out):
    """{n: [k, ...]} of the shard folders in OUT."""
    found = {}
    for path in sorted((pathlib.Path(out) / SHARDS).glob("*-of-*")):
        try:
            k, n = parse_shard(path.name.replace("-of-", "/"))
        except ValueError:
            continue
        found.setdefault(n, []).append(k)
    return found


def _given(options):
    return [k.upper() for k, v in dataclasses.asdict(options).items() if v is not None] if options else []


def begin(out, lab, fingerprint, submissions_dir, shard, entries, *, only=(), fresh=False, options=None):
    """(the run's state, the shard's folder, [(student, path)] to grade): slice k of n without a trusted result.

    Raises StateError, saying what to do, before anything is written."""
    k, n = parse_shard("/".join(map(str, shard)))
    out, where = pathlib.Path(out), f"SHARD={k}/{n}"
    if fresh:
        raise run_state.StateError(f"{where}: a shard grades with the run that make grade-init wrote; to start the "
                                   "class anew, run make grade-init ... FRESH=1, then every shard")
    if _given(options):
        raise run_state.StateError(f"{where}: {', '.join(_given(options))} belong to the whole class: pass them to "
                                   "make grade-init (or make grade-merge), not to a shard")
    if not (out / "state.json").exists():
        raise run_state.StateError(f"{where}: OUT={out} holds no run to grade a slice of: run make grade-init LAB="
                                   f"{lab} SUBMISSIONS=... OUT={out} once first (it writes OUT/state.json, which every "
                                   "shard reads)")
    state = _init_state(out, lab, fingerprint, where)
    if not state.get("run") or state.get("expected") is None:
        raise run_state.StateError(f"{where}: OUT={out} holds a run that make grade-init did not write (or did not "
                                   "finish): run make grade-init ... FRESH=1, then every shard")
    resolved = str(pathlib.Path(submissions_dir).resolve())
    if state.get("submissions") != resolved:
        raise run_state.StateError(f"{where}: OUT={out} is the run of SUBMISSIONS={state.get('submissions')}, not "
                                   f"{resolved}: every shard grades the folder init was given, at the same path")
    others = sorted(f"{j}-of-{m}" for m, ks in _splits(out).items() if m != n for j in ks)
    if others:
        raise run_state.StateError(f"{where}: OUT/{SHARDS} holds slices of another split ({', '.join(others[:3])}): "
                                   "one run has one N; delete those folders, or grade with their N")
    path = folder(out, k, n)
    marker = _marker(path)
    if marker is not None and marker.get("run") != state["run"]:
        raise run_state.StateError(f"{where}: {path} holds results graded with another run's state (an earlier "
                                   f"make grade-init): delete {path}, then grade this shard again")
    mine = {s: p for s, p in entries.items() if slice_of(s, n) == k}
    if only:
        strangers = [s for s in only if s not in mine]
        if strangers:
            raise grading.GradingError(f"{where}: ONLY={' '.join(strangers)}: " + "; ".join(
                f"{s} is in shard {slice_of(s, n)}/{n}" if s in entries else f"{s} has no submission"
                for s in strangers))
        todo = [(s, mine[s]) for s in only]
    else:
        todo = [(s, p) for s, p in sorted(mine.items()) if not grading._trusted(path, s)]
    path.mkdir(parents=True, exist_ok=True)
    (path / "shard.json").write_text(json.dumps({"run": state["run"], "shard": [k, n], "students": sorted(mine)}))
    return state, path, todo


def _init_state(out, lab, fingerprint, where):
    """The run init wrote in OUT, refused if this machine's lab, solution or probes are not the ones it graded with."""
    try:
        return run_state.load_or_start(out, lab, fingerprint, fresh=False)
    except run_state.StateError as exc:
        if "changed since" not in str(exc):
            raise
        raise run_state.StateError(f"{where}: the lab, its solution or its probes are not the ones make grade-init "
                                   "graded with: pass init's PROBES= and SOLUTIONS= on every machine, from the same "
                                   "commit of the course, or run make grade-init ... FRESH=1 and every shard "
                                   "again") from None


def graded(out, state, shard, path, entries, todo):
    """The shard's results (a Graded list), and the line that says what it did and what comes next."""
    k, n = shard
    mine = sorted(s for s in entries if slice_of(s, n) == k)
    results = load_results(path, mine)
    kept = len(mine) - len(todo)
    line = (f"graded {len(todo)} submission{'' if len(todo) == 1 else 's'} of shard {k}/{n} into {path}"
            f"{f' ({kept} kept from an earlier run of it)' if kept else ''}; {len(mine)} of the class's "
            f"{len(entries)} are in it; once every shard is done: make grade-merge OUT={out}")
    return grading.Graded(results, [s for s, _ in todo], None, [line])


def merge(out, *, probes_dir=None, labs_dir=None, solutions_dir=None, options=None):
    """Write OUT's reports from its shards' results, as one run on one machine would; return a Graded list.

    Raises StateError when a shard is missing, of another split or of another run, naming what to run."""
    out = pathlib.Path(out)
    try:
        state = json.loads((out / "state.json").read_text())
    except (OSError, ValueError):
        raise run_state.StateError(f"OUT={out} holds no run to merge: make grade-init, make grade SHARD=k/N for every "
                                   "k, then make grade-merge") from None
    lab, submissions_dir = state.get("lab"), state.get("submissions")
    labs = grading.lab_notebook(labs_dir or grading.ROOT / "labs", lab)
    solution_path = grading.lab_notebook(solutions_dir or grading.ROOT / "solutions", lab)
    probe_file = pathlib.Path(probes_dir or probe_files.DEFAULT_DIR) / f"lab{lab}.py"
    _init_state(out, lab, run_state.fingerprint(labs, solution_path, probe_file), "grade-merge")
    splits = _splits(out)
    if not splits:
        raise run_state.StateError(f"OUT={out} holds no shard yet: run make grade ... OUT={out} SHARD=k/N for k = 1 "
                                   "to N first")
    if len(splits) > 1:
        raise run_state.StateError(f"OUT/{SHARDS} holds slices of {' and of '.join(map(str, sorted(splits)))}: one "
                                   "run has one N; delete the folders of the other split, then merge")
    (n, _), = splits.items()
    for k in range(1, n + 1):
        marker = _marker(folder(out, k, n))
        if marker is not None and marker.get("run") != state.get("run"):
            raise run_state.StateError(f"{folder(out, k, n)} was graded with another run's state (not this OUT's "
                                       f"state.json): delete it and run make grade ... SHARD={k}/{n} again")
    paths, refused = submissions.listing(submissions_dir)
    students = sorted({**paths, **refused})
    missing = [s for s in students if not result_path(folder(out, slice_of(s, n), n), s).exists()]
    if missing:
        shards = sorted({slice_of(s, n) for s in missing})
        named = ", ".join(f"{s} (shard {slice_of(s, n)}/{n})" for s in missing[:10]) + (", ..." if missing[10:] else "")
        raise run_state.StateError(
            f"{len(missing)} of {len(students)} students have no result yet: {named}"
            f": run make grade ... {', '.join(f'SHARD={k}/{n}' for k in shards)} (a shard grades only its students "
            "without a result), then merge again")
    _gather(out, n, students)
    options = (options or grading.Options()).merged(state.get("options"))
    options.check(lab)
    run_state.save(out, {**state, "options": {k: v for k, v in dataclasses.asdict(options).items() if v is not None}})
    began = datetime.datetime.fromisoformat(state["began"]) if state.get("began") else \
        datetime.datetime.now(datetime.timezone.utc)
    released = nbformat.read(labs, as_version=4)
    solution = nbformat.read(solution_path, as_version=4)
    return grading.report_class(out, lab, released, solution, paths, refused, submissions_dir=submissions_dir,
                                probes_dir=probes_dir, labs_dir=labs_dir, options=options, began=began,
                                graded=[])


def _gather(out, n, students):
    """Each student's result, executed notebook and kernel log from their shard into OUT; the shards' grader logs."""
    for sub in ("executed", "feedback", "results", "logs"):
        (out / sub).mkdir(parents=True, exist_ok=True)
    for student in students:
        source = folder(out, slice_of(student, n), n)
        for sub, name in (("results", f"{student}.json"), ("executed", f"{student}.ipynb"),
                          ("logs", f"{student}.log")):
            if (source / sub / name).exists():
                shutil.copyfile(source / sub / name, out / sub / name)
            else:  # none in this run: an earlier merge's must not stay
                (out / sub / name).unlink(missing_ok=True)
    logs = [(k, folder(out, k, n) / "logs" / "grader.log") for k in range(1, n + 1)]
    text = "".join(f"[shard {k}/{n}] {line}\n" for k, log in logs if log.exists()
                   for line in log.read_text(errors="replace").splitlines())
    (out / "logs" / "grader.log").write_text(text)


def arguments():
    parser = argparse.ArgumentParser(description="Merge the shards of a class graded with SHARD=k/N into OUT.")
    parser.add_argument("--out", required=True, help="the OUT that make grade-init wrote and the shards graded into")
    parser.add_argument("--probes", default=None, help="directory of private probe files labNN.py (as the shards')")
    parser.add_argument("--solutions", default=None, help="directory of private solutions NN_*.ipynb")
    parser.add_argument("--labs", default=None, help="directory of the released labs NN_*.ipynb (default: labs/)")
    parser.add_argument("--format", choices=tuple(grading.gradebook.FORMATS), default=None,
                        help="also write OUT/gradebook-FORMAT.csv for that LMS (default: init's)")
    parser.add_argument("--assignment", default=None, help="the LMS's column name (default: init's, or 'Lab NN')")
    parser.add_argument("--deadline", default=None, help="ISO time: apply the late policy (default: init's)")
    parser.add_argument("--late-per-day", type=float, default=None, help="fraction of the points lost per day late")
    parser.add_argument("--late-max-days", type=int, default=None, help="later than this scores 0")
    parser.add_argument("--times", default=None, help="CSV student,submitted_iso (default: the files' mtimes)")
    return parser


def main(argv=None):
    options = arguments().parse_args(argv)
    chosen = grading.Options(options.format, options.assignment, options.deadline, options.late_per_day,
                             options.late_max_days,
                             str(pathlib.Path(options.times).resolve()) if options.times else None)
    try:
        results = merge(options.out, probes_dir=options.probes, labs_dir=options.labs,
                        solutions_dir=options.solutions, options=chosen)
    except (grading.GradingError, run_state.StateError, FileNotFoundError, ValueError) as exc:
        print(f"grade-merge: {exc}", file=sys.stderr)
        return 2
    errors = [r["student"] for r in results if r["status"] == "grader_error"]
    print(f"merged {len(results)} student{'' if len(results) == 1 else 's'} into {options.out}/grades.csv; answers "
          f"alike: {options.out}/similarity.md")
    lab = json.loads((pathlib.Path(options.out) / "state.json").read_text())["lab"]
    pending = grading._pending(argparse.Namespace(lab=lab, probes=options.probes, out=options.out), results)
    if pending:
        print(f"{pending} of {len(results)} student(s) have parts graded by hand without points: fill the points "
              f"column of {options.out}/manual.csv (the texts are in {options.out}/manual/), then merge again; their "
              "LMS grade stays blank until then")
    if errors:
        print(f"grade-merge: {len(errors)} grader_error(s) ({', '.join(errors[:5])}): run their shards again (each "
              "grades them again), then merge again")
    for note in results.notes:
        print(f"grade-merge: {note}")
    if results.lms:
        print(f"wrote {results.lms}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
