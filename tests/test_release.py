"""make release: the student repository holds no solution, probe or answer key, refuses answer code, names the
address students clone in every notebook, and runs its own make test.

One release is built for the module (the scan of every shipped file: about 20 s on 2 cores). Everything run inside
it gets PYTHONPATH=<release> and a sitecustomize that takes this repository's editable install (a finder on
sys.meta_path, behind sys.path) out of every process, so `helpers` is the release's own or nothing.
"""
import json
import os
import pathlib
import re
import subprocess
import sys
import textwrap

import nbformat
import pytest

from helpers.grading.prepare import answer_scan, release
from helpers.grading.prepare.labgen import ROOT
from tests.processes import fresh_interpreter_env

REPO = "https://github.com/dp-course/data-parallelism-hands-on.git"  # what an instructor passes as COURSE_REPO

# Lines of an answer that a shipped helper holds on purpose, below the scan's bar (release.py's docstring).
OPEN = {
    ("helpers/simulate.py", "5.2"): "chapter 05's simulator, scaling_efficiency: 2 of 5.2's 3 statements",
    ("helpers/grading/checks/lab07/common.py", "7.3"): "the padded layout the check compares with: 2 of 7.3's 9",
}


def regions():
    notebooks = {p.name: nbformat.read(p, as_version=4) for p in sorted((ROOT / "solutions").glob("[0-9]*.ipynb"))}
    return answer_scan.solution_regions(notebooks)


# Imported by every interpreter started inside the release (PYTHONPATH), after the .pth files: without the editable
# install's finder, `helpers` can only come from the release (the forked kernels and ranks inherit sys.meta_path).
ONLY_THE_RELEASE = """import sys
sys.meta_path[:] = [f for f in sys.meta_path if not getattr(f, "__module__", "").startswith("__editable__")]
"""


def in_release(out, *args, timeout=300, **extra):
    """Run a command inside the release with its own helpers; returns the CompletedProcess."""
    shim = out.parent / "only-the-release"
    shim.mkdir(exist_ok=True)
    (shim / "sitecustomize.py").write_text(ONLY_THE_RELEASE)
    # Not this run's pytest, xdist or zygote settings: the release's make test starts its own.
    env = {k: v for k, v in fresh_interpreter_env(**extra).items()
           if not k.startswith(("PYTEST_", "DP_COURSE_")) and k not in ("JUPYTER_PATH", "PYTHONPATH")}
    env["PYTHONPATH"] = os.pathsep.join([str(shim), str(out)])
    return subprocess.run(args, cwd=out, env=env, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def released(tmp_path_factory):
    """The release as make release writes it: (out, shipped, left out); its scan refuses any answer code."""
    return release.build(tmp_path_factory.mktemp("release") / "student-repo", repo=REPO)


def make_command(*args):
    """make with this repository's .venv, never reinstalling it (-o: its stamp counts as up to date)."""
    venv = pathlib.Path(sys.executable).parent.parent
    return ["make", "-o", str(venv / ".installed"), f"VENV={venv}", *args]


def make(*args, cwd=ROOT):
    return subprocess.run(make_command(*args), cwd=cwd, capture_output=True, text=True, timeout=120)


GOOD = [REPO, "http://git.university.edu/dp/course", "ssh://git@gitlab.com/dp-course/course.git",
        "git://git.kernel.org/pub/dp.git", "git@github.com:dp-course/dp.git"]
BAD = {"": "no COURSE_REPO", "  ": "no COURSE_REPO", None: "no COURSE_REPO",
       "https://github.com/YOUR-ORG/data-parallelism-hands-on.git": "is a placeholder",
       "https://github.com/your_org/dp.git": "is a placeholder",
       "https://github.com/<owner>/<name>.git": "is a placeholder",
       "https://example.com/dp.git": "is a placeholder",
       "dp-course": "is not an http(s), ssh or git URL", "github.com/dp-course/dp": "is not an http(s), ssh or git URL",
       "file:///srv/dp.git": "is not an http(s), ssh or git URL", "https://github.com": "is not an http(s), ssh or git",
       'https://github.com/dp-course/dp".git': "holds spaces, quotes or backslashes",
       "https://github.com/dp course/dp.git": "holds spaces, quotes or backslashes"}


@pytest.mark.timeout(60)
def test_the_address_students_clone_must_be_given_and_real(tmp_path, capsys):
    assert [release.check_repo(url) for url in GOOD] == GOOD
    for url, reason in BAD.items():
        with pytest.raises(release.ReleaseError) as refused:
            release.check_repo(url)
        message = str(refused.value)
        assert reason in message and "COURSE_REPO=https://github.com/" in message and "\n" not in message, message
    assert release.main(["--out", str(tmp_path / "student-repo")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("make release: no COURSE_REPO") and err.count("\n") == 1, err
    assert not (tmp_path / "student-repo").exists()


@pytest.mark.timeout(120)
def test_make_release_without_course_repo_refuses_in_one_line(tmp_path):
    refused = make("-s", "release", f"OUT={tmp_path / 'student-repo'}")
    # make's own line: "make: ***" alone, "make[1]: ***" as a sub-make of make test
    reason = [line for line in refused.stderr.splitlines() if not re.match(r"make(\[\d+\])?: \*\*\*", line)]
    assert refused.returncode == 2 and len(reason) == 1 and reason[0].startswith("make release: no COURSE_REPO: "), (
        refused.stdout, refused.stderr)
    assert "make release OUT=../student-repo COURSE_REPO=https://github.com/" in reason[0]
    usage = make("-s", "release")
    assert usage.returncode == 2 and "usage: make release OUT=../student-repo COURSE_REPO=" in usage.stdout
    assert "make release OUT=dir COURSE_REPO=url" in make("-s", "help").stdout
    assert not (tmp_path / "student-repo").exists()


@pytest.mark.timeout(60)
def test_out_must_be_new_and_outside_the_repository(tmp_path, capsys):
    with pytest.raises(release.ReleaseError, match=r"inside the course repository .* OUT=\.\./student-repo"):
        release.check_out(ROOT / "build" / "student", ROOT)
    (tmp_path / "old.txt").write_text("x")
    with pytest.raises(release.ReleaseError, match=r"exists and is a directory holding 1 entries.*new path"):
        release.check_out(tmp_path, ROOT)
    with pytest.raises(release.ReleaseError, match=r"exists and is a file"):
        release.check_out(tmp_path / "old.txt", ROOT)
    assert release.check_out(tmp_path / "new", ROOT) == (tmp_path / "new").resolve()
    assert release.main(["--out", str(ROOT / "labs"), "--course-repo", REPO]) == 2
    assert "make release: OUT=" in capsys.readouterr().err


def planted_copy(region):
    """The region with other names, no comments and other spacing: what a careless edit would ship."""
    code = re.sub(r"\s+#.*", "", region.code)
    for old, new in (("params", "ps"), ("size", "n"), ("rank", "r"), ("self", "unit")):
        code = re.sub(rf"\b{old}\b", new, code)
    return "def helper(unit, module):\n" + textwrap.indent(code.replace(", ", ","), "    ") + "\n"


@pytest.mark.timeout(120)
def test_a_planted_copy_of_a_solution_refuses_the_release(tmp_path, monkeypatch):
    region = next(r for r in regions() if r.question == "8.1")
    leak = planted_copy(region)
    cell = nbformat.v4.new_code_cell("%%ranks 2\n" + leak)
    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell("# A chapter"), cell])
    shipped = {"chapters/capstone/leak.py": "import torch\n\n\n" + leak,
               "chapters/99_leak.ipynb": nbformat.writes(notebook)}
    monkeypatch.setattr(release, "plan", lambda root, repo: (dict(shipped), {}))
    out = tmp_path / "student-repo"
    with pytest.raises(release.ReleaseError) as refused:
        release.build(out, repo=REPO, git=False)
    message = str(refused.value)
    assert "refusing to release: 2 shipped file(s)" in message
    assert f"chapters/capstone/leak.py line 5: lab 8.1's answer ({region.where})" in message
    assert f"chapters/99_leak.ipynb cell 1 line 3: lab 8.1's answer ({region.where})" in message
    assert "with names changed" in message and "ALLOWED in helpers/grading/prepare/release.py" in message
    assert not out.exists(), "nothing is written when the release is refused"


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_release_holds_no_solution_probe_or_key(released):
    out, shipped, left = released
    files = {str(p.relative_to(out)) for p in out.rglob("*") if p.is_file() and ".git" not in p.relative_to(out).parts}
    assert not [f for f in files if f.startswith(("solutions/", "helpers/grading/probes/", "tests/mistakes/"))]
    assert not [f for f in files if f.endswith(("ANSWERS.md", "labgen.py", "grade.py", "probe_runtime.py"))]
    assert {f"labs/{p.name}" for p in (ROOT / "labs").glob("*.ipynb")} <= files
    assert "RELEASE_MANIFEST.md" in files and "`solutions/ANSWERS.md`" in (out / "RELEASE_MANIFEST.md").read_text()
    log = subprocess.run(["git", "log", "--format=%s", "--name-only"], cwd=out, capture_output=True, text=True).stdout
    assert log.startswith("Student release of the course") and log.count("Student release") == 1
    assert "solutions/" not in log and "probes/" not in log


def release_files(out):
    """{relative path: text} of every text file of the release, its .git aside."""
    found = {}
    for p in out.rglob("*"):
        if p.is_file() and ".git" not in p.relative_to(out).parts:
            try:
                found[str(p.relative_to(out))] = p.read_text()
            except UnicodeDecodeError:
                continue
    return found


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_every_notebook_of_the_release_clones_the_address_given(released):
    out, *_ = released
    texts = release_files(out)
    assert not [p for p, text in texts.items() if re.search(r"YOUR-ORG|<this repository>", text, re.IGNORECASE)]
    colab = release.colab_cell_module(out)
    assert colab.COURSE_REPO == REPO, "the release's scripts/colab_cell.py (tests/test_install.py compares with it)"
    notebooks = [p for p in texts if p.endswith(".ipynb")]
    assert {f"labs/{p.name}" for p in (ROOT / "labs").glob("*.ipynb")} | {
        f"chapters/{p.name}" for p in (ROOT / "chapters").glob("*.ipynb")} == set(notebooks)
    for path in notebooks:
        first = next(c for c in nbformat.reads(texts[path], as_version=4).cells if c.cell_type == "code")
        assert first.source == colab.cell_source(path.split("/")[0], repo=REPO), path
        assert f'COURSE_REPO = "{REPO}"' in first.source, path
    assert f"`{REPO}`" in texts["RELEASE_MANIFEST.md"]


def make_target(makefile, name):
    """The lines of a Makefile target, from its name to the next blank line."""
    found = re.search(rf"^{name}:.*?(?=\n\n|\Z)", makefile, re.MULTILINE | re.DOTALL)
    return found[0] if found else None


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_release_make_lab_serves_the_checkout_and_prints_chapter_00(released):
    out, *_ = released
    mine, theirs = (ROOT / "Makefile").read_text(), (out / "Makefile").read_text()
    assert make_target(theirs, "lab") == make_target(mine, "lab") is not None
    first = "chapters/00_first_distributed_program.ipynb"
    assert (out / first).is_file()
    dry = make("-n", "lab", cwd=out)
    assert dry.returncode == 0, dry.stderr
    command = " ".join(dry.stdout.replace("\\\n", " ").split())
    assert f"jupyter lab {first} --ServerApp.root_dir=. --LabApp.default_url=/lab/tree/{first}" in command, command
    # The options of the targets left out go with them; make test runs the student labs too (no tests/test_labs.py).
    assert not re.search(r"^(OUT|LAB|COURSE_REPO) \?=|make (grade|release|labs)\b", theirs, re.MULTILINE)
    assert "NOTEBOOKS := $(wildcard chapters/*.ipynb labs/*.ipynb)" in theirs


def whole(line):
    """A line as a pattern that `self.params = ...` does not match for `params = ...`."""
    return re.compile(rf"(?<![\w.]){re.escape(line)}(?!\w)")


def holds(text, line):
    """line is in text as a whole line of code (see whole)."""
    # The substring test first: the pattern starts with a lookbehind, so re tries it at every position of every
    # file (measured: 13.6 of this module's CPU-seconds went to re.search, nearly all on texts without the line).
    return line in text and whole(line).search(text) is not None


def distinctive_line(region, handed_out):
    """The region's first line of 25 characters or more that no chapter or lab shows (their texts), or None."""
    lines = (re.sub(r"\s+#.*", "", line).strip() for line in region.code.splitlines())
    return next((line for line in lines if len(line) >= 25
                 and not any(holds(text, line) for text in handed_out)), None)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_no_solution_line_appears_in_the_release(released):
    out, *_ = released
    texts = {str(p.relative_to(out)): p.read_text(errors="replace") for p in out.rglob("*")
             if p.is_file() and ".git" not in p.relative_to(out).parts}
    # the repository's files, as the release takes them: a __pycache__ left by a run is not handed out
    handed_out = [(ROOT / p).read_text() for p in release.tracked_files(ROOT) if p.startswith(("chapters/", "labs/"))]
    checked, found = 0, []
    for region in regions():
        line = distinctive_line(region, handed_out)
        if line is None:
            continue
        checked += 1
        found += [f"lab {region.question}'s line {line!r} ({region.where}) is in {path}" for path, text in texts.items()
                  if holds(text, line) and (path, region.question) not in OPEN]
    assert not found, "\n".join(found)
    assert checked >= 35, f"only {checked} regions have a line no chapter or lab shows"


# A pytest plugin for the release's make test (PYTEST_ARGS="-p release_subset"): everything is collected (a collection
# error fails the run), then only chapter 00 and lab 03 run. It writes what it saw to $RELEASE_SUBSET_REPORT: where
# `helpers` came from, any module loaded from this repository, the items, and lab 03's check results.
SUBSET_PLUGIN = """import json, os, sys
KEEP = ("chapters/00_first_distributed_program.ipynb", "labs/03_manual_ddp.ipynb")
seen = {"collected": 0, "collect_errors": [], "selected": [], "checks": []}

def pytest_collectreport(report):
    if report.failed:
        seen["collect_errors"].append(report.nodeid)

def pytest_collection_modifyitems(session, config, items):
    seen["collected"] = len(items)
    keep = [item for item in items if item.nodeid.startswith(KEEP)]
    config.hook.pytest_deselected(items=[item for item in items if item not in keep])
    items[:] = keep
    seen["selected"] = [item.nodeid for item in keep]

def pytest_runtest_teardown(item):
    from helpers.grading.check import MIMETYPE
    for output in getattr(item, "test_outputs", None) or []:  # an nbval cell's outputs
        if MIMETYPE in output.get("data", {}):
            seen["checks"].append(output["data"][MIMETYPE])

def pytest_sessionfinish(session, exitstatus):
    import helpers
    seen["helpers"], seen["exit"] = helpers.__file__, int(exitstatus)
    root, venv = os.environ["NOT_FROM"].split(os.pathsep)  # this repository, less its .venv
    files = {name: str(getattr(module, "__file__", None) or "") for name, module in list(sys.modules.items())}
    seen["elsewhere"] = sorted(name for name, f in files.items() if f.startswith(root) and not f.startswith(venv))
    with open(os.environ["RELEASE_SUBSET_REPORT"], "w") as f:
        json.dump(seen, f)
"""


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_the_release_make_test_collects_everything_and_runs_chapter_00_and_lab_03(released, tmp_path):
    out, *_ = released
    (out.parent / "only-the-release").mkdir(exist_ok=True)
    (out.parent / "only-the-release" / "release_subset.py").write_text(SUBSET_PLUGIN)
    report = tmp_path / "subset.json"
    # The release's own make test (its Makefile, plugins, tests and notebooks), with this repository's interpreter
    # and one worker; its own .venv would cost minutes of pip.
    run = in_release(out, *make_command("test", "TEST_WORKERS=0", "PYTEST_ARGS=-p release_subset -q"), timeout=540,
                     RELEASE_SUBSET_REPORT=str(report), NOT_FROM=f"{ROOT}{os.sep}{os.pathsep}{sys.prefix}{os.sep}")
    assert report.is_file(), (run.stdout[-3000:], run.stderr[-3000:])
    seen = json.loads(report.read_text())
    assert seen["helpers"] == str(out / "helpers" / "__init__.py") and seen["elsewhere"] == [], seen
    assert seen["collect_errors"] == [] and run.returncode == 0 and seen["exit"] == 0, (
        seen["collect_errors"], run.stdout[-3000:], run.stderr[-3000:])
    assert seen["collected"] > 500, seen["collected"]  # the release's tests, chapters and labs
    ran = {item.split("::")[0] for item in seen["selected"]}
    assert ran == {"chapters/00_first_distributed_program.ipynb", "labs/03_manual_ddp.ipynb"}, ran
    results = {r["question"]: r for r in seen["checks"]}
    assert set(results) == {"3.1", "3.2", "3.3", "3.4"}, sorted(results)
    assert all(r["not_implemented"] == r["total"] > 0 for r in results.values()), results


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_release_makefile_runs_only_what_the_release_holds(released):
    out, *_ = released
    makefile = (out / "Makefile").read_text()
    shipped = {str(p.relative_to(out)) for p in out.rglob("*.py")}
    for module in re.findall(r"-[mp] (tests\.\w+|helpers\.[\w.]+|scripts\.\w+)", makefile):  # modules, plugins
        assert release.module_path(module, shipped), module
    for script in re.findall(r"\b(scripts/\w+\.py)", makefile):
        assert (out / script).is_file(), script
    dry = make("-n", "test", cwd=out)
    assert dry.returncode == 0 and "tests chapters/" in dry.stdout and "labs/03_manual_ddp.ipynb" in dry.stdout, dry
