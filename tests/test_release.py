"""make release: the student repository holds no solution, probe or answer key, refuses answer code, and runs.

One release is built for the module (the scan of every shipped file: about 20 s on 2 cores). Everything run inside
it gets PYTHONPATH=<release>, so `helpers` is the release's own, never this repository's editable install.
"""
import json
import re
import subprocess
import sys
import textwrap

import nbformat
import pytest

from helpers.grading import answer_scan, release
from helpers.grading.labgen import ROOT
from tests.processes import fresh_interpreter_env

# Lines of an answer that a shipped helper holds on purpose, below the scan's bar (release.py's docstring).
OPEN = {
    ("helpers/simulate.py", "5.2"): "chapter 05's simulator, scaling_efficiency: 2 of 5.2's 3 statements",
    ("helpers/grading/checks/lab07/common.py", "7.3"): "the padded layout the check compares with: 2 of 7.3's 9",
}


def regions():
    notebooks = {p.name: nbformat.read(p, as_version=4) for p in sorted((ROOT / "solutions").glob("[0-9]*.ipynb"))}
    return answer_scan.solution_regions(notebooks)


def in_release(out, *args, timeout=300):
    """Run a command inside the release with its own helpers; returns the CompletedProcess."""
    env = fresh_interpreter_env(PYTHONPATH=str(out))
    return subprocess.run(args, cwd=out, env=env, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def released(tmp_path_factory):
    """The release as make release writes it: (out, shipped, left out); its scan refuses any answer code."""
    return release.build(tmp_path_factory.mktemp("release") / "student-repo")


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
    assert release.main(["--out", str(ROOT / "labs")]) == 2
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
    monkeypatch.setattr(release, "plan", lambda root: (dict(shipped), {}))
    out = tmp_path / "student-repo"
    with pytest.raises(release.ReleaseError) as refused:
        release.build(out, git=False)
    message = str(refused.value)
    assert "refusing to release: 2 shipped file(s)" in message
    assert f"chapters/capstone/leak.py line 5: lab 8.1's answer ({region.where})" in message
    assert f"chapters/99_leak.ipynb cell 1 line 3: lab 8.1's answer ({region.where})" in message
    assert "with names changed" in message and "ALLOWED in helpers/grading/release.py" in message
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


# One interpreter for both steps: each new one imports torch and nbformat again (measured: 6.4 CPU-seconds of the
# 18.8 that the two steps took in two interpreters). No rfc3987_syntax, as in make test's pytest processes
# (tests/warm_kernels.py): nbformat imports jsonschema, which imports it to build an Earley parser for a format
# nothing here checks (import nbformat: 3.8 CPU-s with it, 0.4 without).
LAB_RESULTS, COLLECTED = "lab checks: ", "collect-only exit code: "
RUN_LAB_AND_COLLECT = f"LAB_RESULTS, COLLECTED = {LAB_RESULTS!r}, {COLLECTED!r}\n" + r"""
import json, os, re, sys
sys.modules.setdefault("rfc3987_syntax", None)
import nbformat
import helpers
assert helpers.__file__.startswith(os.getcwd()), helpers.__file__
os.chdir("labs")
namespace, results = {}, {}
for cell in nbformat.read("06_memory_anatomy.ipynb", as_version=4).cells:
    if cell.cell_type != "code":
        continue
    question = re.fullmatch(r'check\("(\d+\.\d+)", globals\(\)\)', cell.source.strip())
    if question:
        results[question[1]] = namespace["check"](question[1], namespace).as_dict()
    elif not cell.source.startswith("%%"):  # %load_ext helpers: the magics are tested in test_magic.py
        source = "\n".join("" if line.startswith("%") else line for line in cell.source.splitlines())
        exec(compile(source, cell.id, "exec"), namespace)
print(LAB_RESULTS + json.dumps(results), flush=True)
os.chdir("..")
import pytest
code = pytest.main(["--collect-only", "-q", "-p", "no:cacheprovider", "tests"])
print(COLLECTED + str(int(code)), flush=True)
"""


def printed(stdout, prefix):
    """What the line of stdout that starts with prefix says after it, or None."""
    return next((line[len(prefix):] for line in stdout.splitlines() if line.startswith(prefix)), None)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_release_runs_its_lab_checks_and_collects_its_tests(released):
    out, *_ = released
    run = in_release(out, sys.executable, "-c", RUN_LAB_AND_COLLECT)
    lab = printed(run.stdout, LAB_RESULTS)
    assert lab is not None, run.stderr[-3000:]
    results = json.loads(lab)
    assert set(results) == {"6.1", "6.2", "6.3", "6.4"}
    for question, result in results.items():
        assert result["not_implemented"] == result["total"] > 0, (question, result["lines"])
    assert run.returncode == 0 and printed(run.stdout, COLLECTED) == "0", (run.stdout[-3000:], run.stderr[-3000:])
    makefile = (out / "Makefile").read_text()
    for module in re.findall(r"-[mp] (tests\.\w+|helpers\.[\w.]+|scripts\.\w+)", makefile):  # modules, plugins
        assert release.module_path(module, {str(p.relative_to(out)) for p in out.rglob("*.py")}), module
    for script in re.findall(r"\b(scripts/\w+\.py)", makefile):
        assert (out / script).is_file(), script
    dry = in_release(out, "make", "-n", "test", "VENV=.venv")
    assert dry.returncode == 0 and "tests chapters/" in dry.stdout, dry.stderr
