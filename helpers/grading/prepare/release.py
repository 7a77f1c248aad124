"""`make release OUT=dir COURSE_REPO=url`: the student edition of the course, without solutions, probes or answers.

    python -m helpers.grading.prepare.release --out ../student-repo --course-repo https://github.com/ORG/NAME.git
    python -m helpers.grading.prepare.release --dry-run      # only says what would ship, and scans it (no address
    needed)

COURSE_REPO is the public address students will clone the release from: the install cell at the top of every
notebook (scripts/colab_cell.py) clones it on Colab, so the release writes it into every chapter's and lab's cell,
into scripts/colab_cell.py (whose test compares the cells with it) and into the docs' `git clone <this repository>`. It
refuses an address that is missing, not an http(s), ssh or git URL (nor `git@host:path`), or a placeholder
(YOUR-ORG, <owner>, example.com): the students' notebooks would name an address that clones nothing.

OUT must be new (or an empty directory) and outside this repository: the release is a new repository with a
history of its own, never a copy of this one's `.git`. It ships the working tree (git's tracked files and the
untracked ones not ignored; the manifest counts what was not committed). What it leaves out
(OUT/RELEASE_MANIFEST.md lists every file):

| left out | why |
|---|---|
| `solutions/` | the lab sources, answers between BEGIN/END SOLUTION markers; ANSWERS.md, the exercise key |
| `helpers/grading/probes/` | the hidden tests: inputs, judges, the list of forbidden shortcuts |
| the grader: `helpers/grading/**/*.py` (the stage folders and the class run) that no chapter, lab, check or helper
imports | grading runs in the private repo |
| tests that read solutions or import what is left out (found by their imports) | they cannot run without it |
| `tests/mistakes/`, `tests/lab_solution.py`, ... (RULES) | built from the solutions' answer cells |

The Makefile loses the targets that need them (labs, grade, bench-grading, release) and every recipe line that
runs a module left out; the README gains a first paragraph saying what this edition is.

**Answer code in what ships.** Before anything is written, every shipped `.py`, notebook and Markdown file is
scanned for the code of every solution region (helpers/grading/prepare/answer_scan.py: statements compared through
`ast`, with and without their names, so comments, spacing and renaming hide nothing). A finding refuses the
release, naming the file, the line or cell, the lab question and the region. ALLOWED holds the exceptions, each
with its reason; it may only hold a chapter that openly teaches a simpler version that the lab generalises.
It is empty today: measured with make release --dry-run (the manifest keeps the table), the chapters that teach
what a lab generalises share at most 57 % of a region's statements (chapter 06 with 6.4's training loop, chapter
08 with 8.4's reduce-scatter, both with names changed), under the 60 % that refuses.

Decisions, with the scan's numbers:
- `chapters/capstone/parallel.py` ("what you built in chapters 03 and 08"). Its ManualDDP broadcast parameters and
  buffers: lab 3.2's answer whole (3 of 3 statements, names changed), and lab 3.2 exists to add the buffers to
  chapter 03's version. The capstone's GPT has no buffers, so ManualDDP now broadcasts parameters as chapter 03
  does and refuses a module with buffers. Its FlatShard shares at most 2 statements in a row with lab 08's regions
  (the storage resize and `all_gather_single` of 8.2, which chapter 08 teaches) and builds its units another way
  (own_parameters and claimed ids, not param_infos and get_submodule): it ships, as chapter 10's open material.
  Lab 10's regions are the learner's own lab 04, 07 and 08 answers pasted whole; parallel.py, train_gpt.py,
  data.py and lab 10's harness `chapters/capstone/yours.py` share no run of 3 statements with them (0 %).
- `helpers/simulate.py` `scaling_efficiency`, chapter 05's simulator, which the chapter calls in the open: 2 of the 3
  statements of 5.2's efficiency region (the return is written another way); a region that short must appear
  whole to refuse. It ships; tests/test_release.py names it where it looks for answer lines.
- The public checks (`helpers/grading/checks/`) of 4.1, 5.2, 6.4, 7.1, 8.2 and 9.1 compute their expected values
  with a reference implementation of the answer (60-100 % of a region). These are answers in what students run;
  they are not allowed: the release refuses until each check compares with recorded values, or with PyTorch, instead.
"""
import argparse
import ast
import datetime
import fnmatch
import importlib.util
import os
import pathlib
import re
import shutil
import subprocess
import sys
import urllib.parse

import nbformat

from helpers.grading.prepare import answer_scan, release_text
from helpers.grading.prepare.labgen import ROOT

# (pattern, reason): the first match leaves a file out. The grader and the tests that need what is left out are
# found by their imports (left_out), so a new grader module or test needs no entry here.
RULES = [
    ("solutions/*", "lab sources with their answers, and the exercise answer key (ANSWERS.md)"),
    ("helpers/grading/probes/*", "hidden tests: their inputs, judges and the shortcuts they refuse"),
    ("helpers/grading/prepare/release.py", "this tool: it reads solutions/"),
    ("helpers/grading/prepare/answer_scan.py", "reads the solutions' answer regions (for this tool)"),
    ("helpers/grading/prepare/release_text.py", "writes this tool's Makefile, README and manifest"),
    ("helpers/grading/prepare/labgen.py", "writes labs/ from solutions/; the release ships the labs it wrote"),
    ("tests/mistakes/*", "the mistake catalogue: each mistake is a solution's answer with one edit"),
    ("tests/lab_solution.py", "runs the solutions' answer cells"),
    ("tests/grading/*", "the grader's tests: fixture classes graded against the solutions and probes"),
    ("tests/test_instructors.py", "checks the answer key, solutions/ANSWERS.md"),
    ("tests/bench_bucketing.py", "times the solution's Reducer (lab 04)"),
    ("tests/bench_grading.py", "times the grader"),
    ("scripts/grading/*", "run the grader's shards on a cluster (SLURM, Kubernetes)"),
]
# {path: reason}: a test that names a path left out and still runs without it.
SHIPS_ANYWAY = {"tests/test_install.py": "globs solutions/ with chapters/ and labs/: finds no solution there, runs"}
# {(path, question): reason}: a shipped file allowed to carry that much of a region. Only for a chapter that openly
# teaches a simpler version that the lab generalises; the reason says what the lab adds.
ALLOWED = {}
GRADER = "the grader: nothing students run imports it; grade from the private repository"
MANIFEST = release_text.MANIFEST


class ReleaseError(ValueError):
    """The release cannot be written; the message says what is wrong and what to do."""


# An address that only looks like one: YOUR-ORG, your_name, <owner>, {org}, example.com, placeholder, changeme.
PLACEHOLDER = re.compile(r"your[-_]|[<>{}\[\]]|\bexample\.(com|org|net)\b|placeholder|changeme|\bxxx", re.IGNORECASE)
SCP_LIKE = re.compile(r"[\w.-]+@[\w.-]+\.[a-z]{2,}:[\w./~-]*\w")  # git@github.com:owner/name.git
REPO_EXAMPLE = "COURSE_REPO=https://github.com/<owner>/<name>.git"


def check_repo(repo):
    """The public address the release's install cells clone, or a one-line ReleaseError naming what to pass."""
    if not repo or not repo.strip():
        raise ReleaseError(f"no COURSE_REPO: every notebook's install cell clones the students' repository on Colab; "
                           f"pass its public address, e.g. make release OUT=../student-repo {REPO_EXAMPLE}")
    if re.search(r"[\s\"'\\]", repo) or not repo.isprintable():
        raise ReleaseError(f"COURSE_REPO={repo!r} holds spaces, quotes or backslashes: pass the address alone, e.g. "
                           f"{REPO_EXAMPLE}")
    if PLACEHOLDER.search(repo):
        raise ReleaseError(f"COURSE_REPO={repo} is a placeholder, not an address students can clone: pass the public "
                           f"repository the release will be published at, e.g. {REPO_EXAMPLE}")
    url = urllib.parse.urlsplit(repo)
    is_url = url.scheme in ("http", "https", "ssh", "git") and bool(url.hostname) and bool(url.path.strip("/"))
    if not is_url and not SCP_LIKE.fullmatch(repo):
        raise ReleaseError(f"COURSE_REPO={repo} is not an http(s), ssh or git URL of a repository (nor git@host:path): "
                           f"pass the address `git clone` takes, e.g. {REPO_EXAMPLE}")
    return repo


def tracked_files(root):
    """Paths (relative, '/') of the files the repository holds: git's tracked and untracked-not-ignored files."""
    try:
        listing = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=root,
                                 capture_output=True, text=True, check=True).stdout.split("\0")
    except (OSError, subprocess.CalledProcessError):  # not a git checkout: every file but the usual litter
        skip = {".git", ".venv", "artifacts", "__pycache__", ".pytest_cache", ".ipynb_checkpoints", "build"}
        listing = [str(p.relative_to(root)) for p in root.rglob("*")
                   if p.is_file() and not skip & set(p.relative_to(root).parts) and ".egg-info" not in str(p)]
    return sorted(p for p in set(listing) if p and (root / p).is_file())  # a deleted tracked file is gone


def module_path(module, files):
    """The file of a dotted module name among files, or None."""
    base = module.replace(".", "/")
    return next((p for p in (f"{base}.py", f"{base}/__init__.py") if p in files), None)


def imported_files(path, text, files):
    """Files among `files` that the Python in path imports (a notebook: its code cells), packages' __init__ too."""
    found = set()
    for _, _, code in answer_scan.code_units(path, text):
        try:
            tree = ast.parse(code)
        except SyntaxError:
            continue
        for node in ast.walk(tree):
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                names = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
            for name in names:
                parts = name.split(".")
                found.update(filter(None, (module_path(".".join(parts[:i]), files) for i in range(1, len(parts) + 1))))
    return found


def left_out(root, files):
    """{path: reason} for every file of `files` the release leaves out."""
    out = {p: reason for p in files
           for reason in [next((why for pattern, why in RULES if fnmatch.fnmatch(p, pattern)), None)] if reason}
    texts = {p: (root / p).read_text() for p in files if p.endswith((".py", ".ipynb"))}
    imports = {p: imported_files(p, t, set(files)) for p, t in texts.items()}
    # What students run: notebooks, the capstone, scripts, helpers outside the grader, the public checks.
    grader = {p for p in files if re.fullmatch(r"helpers/grading/(?:(?:prepare|run|judge|report)/)?[^/]+\.py", p)}
    grader -= {"helpers/grading/__init__.py"}
    reached, todo = set(), [p for p in texts if not p.startswith("tests/") and p not in grader and p not in out]
    while todo:
        p = todo.pop()
        if p not in reached:
            reached.add(p)
            todo += imports.get(p, ())
    out.update({p: GRADER for p in sorted(grader - reached) if p not in out})
    changed = True
    while changed:  # a test that imports or reads what is left out, directly or through another test module
        changed = False
        gone = set(out) | {d for d in {str(pathlib.PurePath(p).parent) for p in out} - {"."}
                           if all(p in out for p in files if p.startswith(d + "/"))}
        for p in texts:
            if p.startswith("tests/") and p not in out and p not in SHIPS_ANYWAY:
                missing = sorted(imports[p] & set(out)) + sorted(named_paths(texts[p]) & gone)
                if missing:
                    out[p], changed = f"imports or reads {missing[0]}, left out", True
    return out


def named_paths(text):
    """Every string constant of a Python file that could be a path: 'solutions', 'solutions/ANSWERS.md'."""
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return set()
    return {n.value.strip("/") for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)
            and re.fullmatch(r"[\w./-]+", n.value)}


def check_out(out, root):
    """Refuse an OUT inside the repository, or one that exists and is not an empty directory."""
    out = pathlib.Path(out).expanduser().resolve()
    if out == root or root in out.parents:
        raise ReleaseError(f"OUT={out} is inside the course repository ({root}): the release must be a repository of "
                           f"its own; pass a directory outside it, e.g. OUT=../student-repo")
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        what = "a file" if not out.is_dir() else f"a directory holding {len(list(out.iterdir()))} entries"
        raise ReleaseError(f"OUT={out} exists and is {what}: the release is written into a new or empty directory; "
                           f"pass a new path, or remove that one first")
    return out


def scan_for_answers(shipped, root, allowed=None):
    """(findings that refuse the release, allowed findings, coverage table) for {path: text} of what ships."""
    allowed = ALLOWED if allowed is None else allowed
    paths = sorted((root / "solutions").glob("[0-9][0-9]_*.ipynb"))
    notebooks = {p.name: nbformat.read(p, as_version=4) for p in paths}
    regions = answer_scan.solution_regions(notebooks)
    texts = {p: t for p, t in shipped.items() if p.endswith(release_text.SCANNED)}
    rows = answer_scan.measure(texts, regions)
    found = answer_scan.findings(rows)
    refused = [f for f in found if (f.path, f.question) not in allowed]
    return refused, [f for f in found if (f.path, f.question) in allowed], answer_scan.coverage_table(rows)


def refusal(refused):
    """The error for findings: every file, where, which question; what to do."""
    lines = "\n".join(f"  {f}" for f in refused)
    return ReleaseError(f"refusing to release: {len(refused)} shipped file(s) carry a lab's answer\n{lines}\n"
                        f"Rewrite that code so it does not hold the answer (a check can compare with recorded values "
                        f"or with PyTorch), or, for a chapter that openly teaches a simpler version the lab "
                        f"generalises, add it to ALLOWED in helpers/grading/prepare/release.py with the reason.")


def colab_cell_module(root):
    """root's scripts/colab_cell.py, loaded as a module (scripts/ is not a package)."""
    spec = importlib.util.spec_from_file_location("colab_cell", root / "scripts" / "colab_cell.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def name_repo(shipped, repo, root):
    """Write repo into the shipped install cells, scripts/colab_cell.py and the docs; the notebooks it wrote."""
    colab = colab_cell_module(root)
    script = "scripts/colab_cell.py"
    line = f'COURSE_REPO = "{repo}"  # written by make release: the address this repository is published at'
    text, found = re.subn(r'^COURSE_REPO = "[^"\n]*".*$', lambda _: line, shipped[script], count=1,
                          flags=re.MULTILINE)
    if not found:
        raise ReleaseError(f'{script} has no line `COURSE_REPO = "..."` to write the address into: restore it '
                           f"(tests/test_install.py compares every notebook's install cell with it)")
    shipped[script] = text
    written = []
    for p in sorted(shipped):
        folder = pathlib.PurePath(p).parent.name
        if not p.endswith(".ipynb") or folder not in colab.WORKING_FOLDER:
            continue
        nb = nbformat.reads(shipped[p], as_version=4)
        cells = [c for c in nb.cells if c.get("id") == colab.CELL_ID]
        if not cells:
            raise ReleaseError(f"{p} has no install cell (id {colab.CELL_ID!r}) to write COURSE_REPO into: run "
                               f"`.venv/bin/python scripts/colab_cell.py` and `make labs`, then release again")
        cells[0].source = colab.cell_source(colab.WORKING_FOLDER[folder], repo=repo)
        shipped[p] = nbformat.writes(nb).rstrip("\n") + "\n"  # as nbformat.write writes it
        written.append(p)
    for p, text in shipped.items():  # the front page's and INSTALL.md's `git clone <this repository> dp-course`
        if p.endswith(".md") and text is not None:
            shipped[p] = text.replace("<this repository>", repo)
    return written


def plan(root=ROOT, repo=None):
    """({path: text or None for binary} that ships, {path: reason} left out); repo: written into the install cells
    (name_repo), or None for a dry run, whose notebooks keep this repository's cells."""
    files = tracked_files(root)
    out = left_out(root, files)
    shipped = {}
    for p in files:
        if p not in out:
            try:
                shipped[p] = (root / p).read_text()
            except UnicodeDecodeError:
                shipped[p] = None
    shipped["Makefile"] = release_text.makefile(shipped["Makefile"], out)
    shipped["README.md"] = release_text.readme(shipped["README.md"])
    if repo is not None:
        name_repo(shipped, repo, root)
    return shipped, out


def source_description(root):
    """'commit abc1234 (+ 3 files not committed), 2026-..', or the date alone outside git: the working tree ships."""
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True)
    if head.returncode:
        return when
    dirty = subprocess.run(["git", "status", "--porcelain"], cwd=root, capture_output=True, text=True).stdout
    extra = f" + {len(dirty.splitlines())} files not committed" if dirty.strip() else ""
    return f"commit {head.stdout.strip()}{extra}, {when}"


def build(out, *, repo, root=ROOT, git=True, allowed=None):
    """Write the release into out (new or empty, outside root), its install cells cloning repo; returns (out,
    shipped, left out)."""
    root = pathlib.Path(root).resolve()
    repo = check_repo(repo)
    out = check_out(out, root)
    shipped, left = plan(root, repo)
    refused, allowed_findings, coverage = scan_for_answers(shipped, root, allowed)
    if refused:
        raise refusal(refused)
    shipped[MANIFEST] = release_text.manifest(shipped, left, coverage, allowed_findings, source_description(root),
                                              repo)
    for p, text in shipped.items():
        target = out / p
        target.parent.mkdir(parents=True, exist_ok=True)
        if text is None:
            shutil.copy2(root / p, target)  # keeps the mode (scripts stay executable) and the time
        elif (root / p).is_file() and text == (root / p).read_text():
            shutil.copy2(root / p, target)
        else:  # rewritten here: the Makefile, README, manifest, notebooks and scripts/colab_cell.py
            target.write_text(text)
            if (root / p).is_file():
                shutil.copymode(root / p, target)
    if git and shutil.which("git"):
        commit(out)
    return out, shipped, left


def commit(out):
    """git init + one commit of everything: a history that holds nothing but the release."""
    env = {**os.environ, "GIT_AUTHOR_NAME": os.environ.get("GIT_AUTHOR_NAME", "course release"),
           "GIT_AUTHOR_EMAIL": os.environ.get("GIT_AUTHOR_EMAIL", "release@localhost")}
    env.setdefault("GIT_COMMITTER_NAME", env["GIT_AUTHOR_NAME"])
    env.setdefault("GIT_COMMITTER_EMAIL", env["GIT_AUTHOR_EMAIL"])
    for args in (["init", "-q"], ["add", "-A"], ["commit", "-q", "-m", "Student release of the course"]):
        subprocess.run(["git", *args], cwd=out, env=env, check=True, capture_output=True)


def main(argv=None):
    parser = argparse.ArgumentParser(description="Write the student release of the course.")
    parser.add_argument("--out", help="a new or empty directory outside this repository")
    parser.add_argument("--course-repo", help="the public address students clone the release from (COURSE_REPO)")
    parser.add_argument("--no-git", action="store_true", help="do not git init the release")
    parser.add_argument("--dry-run", action="store_true", help="only list what would be left out, and scan")
    options = parser.parse_args(argv)
    try:
        if options.dry_run:
            repo = check_repo(options.course_repo) if options.course_repo is not None else None
            shipped, left = plan(ROOT, repo)
            refused, allowed, coverage = scan_for_answers(shipped, ROOT)
            print(release_text.manifest(shipped, left, coverage, allowed, source_description(ROOT), repo))
            if repo is None:
                print("dry run without COURSE_REPO: the notebooks were scanned with this repository's install cell; "
                      "make release itself refuses to run without COURSE_REPO=<the address students clone>")
            if refused:
                raise refusal(refused)
            return 0
        if not options.out:
            raise ReleaseError(f"no OUT: pass the directory to write, e.g. make release OUT=../student-repo "
                               f"{REPO_EXAMPLE}")
        out, shipped, left = build(options.out, repo=options.course_repo, git=not options.no_git)
    except ReleaseError as exc:
        print(f"make release: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {out}: {len(shipped)} files; left out {len(left)} ({MANIFEST} says which and why); every "
          f"notebook's install cell clones {options.course_repo}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
