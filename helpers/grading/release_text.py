"""The texts `make release` rewrites or adds: the Makefile, the README's first paragraph, RELEASE_MANIFEST.md."""
import re

from helpers.grading import answer_scan

DROPPED_TARGETS = ("labs", "grade", "bench-grading", "release")  # they need solutions/, the probes or the grader
MANIFEST = "RELEASE_MANIFEST.md"
SCANNED = (".py", ".ipynb", ".md")


def makefile(text, out):
    """The Makefile without the targets that need what is left out, nor recipe lines that run a module left out."""
    modules = {p[:-3].replace("/", ".") for p in out if p.endswith(".py")}
    kept, skipping = [], False
    for line in text.splitlines():
        target = re.match(r"^([A-Za-z][\w-]*):", line)
        if target:
            skipping = target[1] in DROPPED_TARGETS
        elif skipping and line and not line.startswith("\t"):
            skipping = False
        if target and skipping:
            while kept and kept[-1].startswith("#"):  # the dropped target's own comment
                kept.pop()
        if skipping or any(re.search(rf"-m {re.escape(m)}\b", line) for m in modules):
            continue
        if re.match(r'^\t@echo "make (\S+)', line) and re.match(r'^\t@echo "make (\S+)', line)[1] in DROPPED_TARGETS:
            continue
        if line.startswith(".PHONY:"):
            line = " ".join(w for w in line.split() if w not in DROPPED_TARGETS)
        kept.append(line)
    return re.sub(r"\n{3,}", "\n\n", "\n".join(kept)) + "\n"


def readme(text):
    """The README with a first paragraph saying what this edition is."""
    note = (f"> **Student edition.** Written by `make release` from the course's private repository: the labs' "
            f"solutions, the hidden tests and the grader are not here ({MANIFEST} lists what is left out and why). "
            f"The instructors' sections below describe the private repository.\n\n")
    title, _, rest = text.partition("\n")
    return f"{title}\n\n{note}{rest.lstrip(chr(10))}" if title.startswith("#") else note + text


def manifest(shipped, out, coverage, allowed_findings, source):
    """RELEASE_MANIFEST.md: what is left out and why, and what the scan for answers measured."""
    by_reason = {}
    for p, reason in sorted(out.items()):
        by_reason.setdefault(reason, []).append(p)
    lines = ["# What this release leaves out, and why\n",
             f"Written by `make release` ({source}). {len(shipped)} files shipped, {len(out)} left out.\n"]
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
    lines.append("\nTests left out cannot run here; `make test` runs the others, every chapter included.")
    return "\n".join(lines) + "\n"
