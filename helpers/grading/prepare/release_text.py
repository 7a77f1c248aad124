"""The texts `make release` rewrites or adds: the Makefile, the README's first paragraph, RELEASE_MANIFEST.md."""
import re

from helpers.grading.prepare import answer_scan

DROPPED_TARGETS = ("labs", "grade", "grade-init", "grade-merge", "bench-grading", "release")  # they need solutions/,
# the probes or the grader
MANIFEST = "RELEASE_MANIFEST.md"
SCANNED = (".py", ".ipynb", ".md")


# The private repository runs the student labs in tests/test_labs.py (with the probes, which the release leaves out);
# the release runs them under nbval with the chapters: each must run to its end.
LAB_NOTEBOOKS = ('# Chapters and the student labs run under nbval: a lab must run to its end, its checks saying "not\n'
                 '# implemented" until you write the answers (the private repository: tests/test_labs.py).\n'
                 'NOTEBOOKS := $(wildcard chapters/*.ipynb labs/*.ipynb)')


def makefile(text, out):
    """The Makefile without the targets that need what is left out, nor recipe lines that run a module left out; its
    make test runs the student labs under nbval when tests/test_labs.py is left out."""
    modules = {p[:-3].replace("/", ".") for p in out if p.endswith(".py")}
    if "tests/test_labs.py" in out:
        text, found = re.subn(r"^(#.*\n)*NOTEBOOKS := \$\(wildcard chapters/\*\.ipynb\)$", lambda _: LAB_NOTEBOOKS,
                              text, count=1, flags=re.MULTILINE)
        if not found:
            raise ValueError("Makefile: no line `NOTEBOOKS := $(wildcard chapters/*.ipynb)` to add the labs to: "
                             "restore it, or change helpers/grading/prepare/release_text.py's makefile with it")
    kept, skipping, dropped_help = [], False, False
    for line in text.splitlines():
        target = re.match(r"^([A-Za-z][\w-]*(?: [A-Za-z][\w-]*)*):", line)  # a rule, or a variable of its targets
        if target:
            skipping = all(name in DROPPED_TARGETS for name in target[1].split())
        elif skipping and line and not line.startswith("\t"):
            skipping = False
        if target and skipping:
            while kept and kept[-1].startswith("#"):  # the dropped target's own comment
                kept.pop()
        if skipping or any(re.search(rf"-m {re.escape(m)}\b", line) for m in modules):
            continue
        echo = re.match(r'^\t@echo "(make (\S+)| )', line)  # a target's help line, or its continuation
        if echo:
            dropped_help = echo[2] in DROPPED_TARGETS if echo[2] else dropped_help
            if dropped_help:
                continue
        if line.startswith(".PHONY:"):
            line = " ".join(w for w in line.split() if w not in DROPPED_TARGETS)
        kept.append(line)
    return re.sub(r"\n{3,}", "\n\n", "\n".join(drop_unused_variables(kept))) + "\n"


def drop_unused_variables(lines):
    """Lines less the options of the dropped targets: a comment block that starts `# make <dropped target>`, and
    every `NAME ?=` no kept line uses any more (`OUT ?=`, `COURSE_REPO ?=`: make grade's and make release's)."""
    kept, in_dropped_comment = [], False
    for line in lines:
        if line.startswith("#"):
            header = re.match(r"^# make (\S+)", line)
            in_dropped_comment = (header[1] in DROPPED_TARGETS) if header else in_dropped_comment
            if in_dropped_comment:
                continue
        else:
            in_dropped_comment = False
        kept.append(line)
    text = "\n".join(kept)
    defined = [re.match(r"^(\w+) \?=", line) for line in kept]
    return [line for line, name in zip(kept, defined) if not name or f"$({name[1]})" in text]


def readme(text):
    """The README with a first paragraph saying what this edition is."""
    note = (f"> **Student edition.** Written by `make release` from the course's private repository: the labs' "
            f"solutions, the hidden tests and the grader are not here ({MANIFEST} lists what is left out and why). "
            f"INSTRUCTORS.md and GRADING.md describe the private repository.\n\n")
    title, _, rest = text.partition("\n")
    return f"{title}\n\n{note}{rest.lstrip(chr(10))}" if title.startswith("#") else note + text


def manifest(shipped, out, coverage, allowed_findings, source, repo=None):
    """RELEASE_MANIFEST.md: what is left out and why, the address the install cells clone, what the scan measured."""
    by_reason = {}
    for p, reason in sorted(out.items()):
        by_reason.setdefault(reason, []).append(p)
    where = (f"Every notebook's install cell clones `{repo}` (COURSE_REPO) on Colab.\n" if repo else
             "Dry run without COURSE_REPO: the notebooks keep the private repository's install cell.\n")
    lines = ["# What this release leaves out, and why\n",
             f"Written by `make release` ({source}). {len(shipped)} files shipped, {len(out)} left out.\n", where]
    for reason, paths in by_reason.items():
        lines += [f"- **{reason}**:", *[f"  - `{p}`" for p in paths]]
    lines += ["\n## Scan for answer code\n",
              f"Every shipped {', '.join(SCANNED)} file was compared with every solution region "
              f"(statements through `ast`, names kept and names replaced; refused at "
              f"{answer_scan.COVERAGE:.0%} of a region's statements in runs of {answer_scan.WINDOW}). "
              "Allowed findings: " + (", ".join(str(f) for f in allowed_findings) or "none") + ".\n",
              "The closest shipped files (share of a question's statements, names kept / replaced):\n",
              "| file | question | kept | replaced |", "|---|---|---|---|"]
    closest = sorted(coverage.items(), key=lambda item: -max(item[1]))
    lines += [f"| `{p}` | {q} | {a:.0%} | {b:.0%} |" for (p, q), (a, b) in closest if max(a, b) >= 0.3]
    lines.append("\nTests left out cannot run here; `make test` runs the others, every chapter and student lab too.")
    return "\n".join(lines) + "\n"
