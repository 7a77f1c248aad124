"""Study time by INSTRUCTORS.md's rule, a chapter's main path counted apart from its optional sections.

    .venv/bin/python scripts/study_time.py            # INSTRUCTORS.md's time table (paste it there)
    .venv/bin/python scripts/study_time.py readme     # the README's chapter table
    .venv/bin/python scripts/study_time.py words      # per chapter: main-path words, optional words, code cells
    .venv/bin/python scripts/study_time.py weeks      # per syllabus week: the time stated and the time computed
    .venv/bin/python scripts/study_time.py write      # rewrite the README's and INSTRUCTORS.md's tables in place

The rule (INSTRUCTORS.md, "Time"):
- a chapter: its markdown words at 100 words per minute, plus 1.5 minutes per code cell, rounded to 5 minutes,
  counted twice: once for its main path, once for its optional sections;
- a lab: all its markdown words at 100 words per minute, plus 30 minutes per graded question (a `## N.M` heading),
  rounded to 5 minutes.
Words are `re.findall(r"\\w+", ...)` over markdown source. An optional section starts at a markdown heading whose
text ends with "(optional)" and runs to the next heading of the same or a higher level (as many `#` or fewer); a
code cell inside it is optional too. Lines inside ``` fences are not headings. tests/test_study_time.py holds
INSTRUCTORS.md and the README to these numbers, and every chapter's main path to MAIN_PATH_MAX_WORDS.
"""
import functools
import json
import pathlib
import re
import sys
from dataclasses import dataclass

ROOT = pathlib.Path(__file__).resolve().parent.parent
WORDS_PER_MINUTE = 100
MINUTES_PER_CODE_CELL = 1.5
MINUTES_PER_QUESTION = 30
MAIN_PATH_MAX_WORDS = 5000  # one sitting
WEEK_MAX_MINUTES = 300  # a syllabus week: chapters' main paths + labs due, by the rule
HEADING = re.compile(r"(#{1,6}) ")
QUESTION = re.compile(r"^## (\d+\.\d+)\b", re.M)

# Execution times from the last timing run, not recomputed here: 2026-11-26, nothing else running,
# OMP_NUM_THREADS=1 .venv/bin/python scripts/time_notebooks.py chapters/*.ipynb solutions/*.ipynb
# {notebook: (seconds, 1-minute load average after it)}; a lab's time is its solution's.
MEASURED = {
    "chapters/00_first_distributed_program.ipynb": (27, 1.1), "chapters/01_gradient_averaging.ipynb": (13, 1.3),
    "chapters/02_collectives.ipynb": (22, 1.0), "chapters/03_manual_ddp.ipynb": (17, 1.4),
    "chapters/04_bucketing_and_overlap.ipynb": (28, 2.0), "chapters/05_accumulation_and_scaling.ipynb": (30, 2.0),
    "chapters/06_memory_anatomy.ipynb": (18, 1.4), "chapters/07_zero_1_and_2.ipynb": (24, 1.7),
    "chapters/08_zero_3_fsdp.ipynb": (23, 2.3), "chapters/09_pytorch_fsdp.ipynb": (25, 2.7),
    "chapters/10_capstone_gpt.ipynb": (20, 1.5), "chapters/11_operations.ipynb": (62, 2.2),
    "chapters/12_mixed_precision.ipynb": (20, 1.8), "chapters/13_compression_and_local_steps.ipynb": (17, 1.7),
    # chapter 14: timed alone on 2026-11-29 with other work on the machine (load 12 after it): an upper bound
    "chapters/14_beyond_data_parallelism.ipynb": (62, 12.2),
    "chapters/99_appendix_instruments.ipynb": (11, 1.6),
    "labs/01_gradient_averaging.ipynb": (14, 1.3), "labs/02_collectives.ipynb": (15, 1.4),
    "labs/03_manual_ddp.ipynb": (12, 1.4), "labs/04_bucketing_and_overlap.ipynb": (12, 1.4),
    "labs/05_accumulation_and_scaling.ipynb": (11, 1.4), "labs/06_memory_anatomy.ipynb": (11, 1.3),
    "labs/07_zero_1_and_2.ipynb": (13, 1.2), "labs/08_zero_3_fsdp.ipynb": (12, 1.3),
    "labs/09_pytorch_fsdp.ipynb": (14, 1.3),
    # 2026-11-29, with 10.5 (prefetch), the same command (load 3.0 after it; 43 s at load 13.5); 14 s before 10.5
    "labs/10_capstone_gpt.ipynb": (9, 3.0),
    "labs/11_operations.ipynb": (12, 1.4),
    # 2026-11-29, the same command while other tests ran (load 11): lab 11 took 27 s then, about twice its 12
    "labs/12_mixed_precision.ipynb": (20, 11.2),
    # 2026-11-29, the same command while other tests ran (load 10.6 after it): an upper bound
    "labs/13_compression_and_local_steps.ipynb": (18, 10.6),
}


@dataclass
class Counts:
    """What the rule counts in one notebook; optional_* are 0 for a lab (its words all count, as before)."""
    path: str
    main_words: int = 0
    optional_words: int = 0
    main_code: int = 0
    optional_code: int = 0
    questions: int = 0

    @property
    def is_lab(self):
        return self.path.startswith("labs/")

    @property
    def main_minutes(self):
        """Study time of the main path (a lab: all of it), by the rule."""
        return study_minutes(self.main_words, self.main_code, self.questions)

    @property
    def optional_minutes(self):
        return study_minutes(self.optional_words, self.optional_code)


def study_minutes(words, code_cells, questions=0):
    """Minutes by the rule, rounded to the nearest 5 (halves up); a chapter's questions are 0."""
    minutes = words / WORDS_PER_MINUTE + MINUTES_PER_QUESTION * questions
    minutes += 0 if questions else MINUTES_PER_CODE_CELL * code_cells
    return int(minutes / 5 + 0.5) * 5


def count(path):
    """Counts of the notebook at path (relative to the repository or absolute): main path and optional apart."""
    path = pathlib.Path(path)
    path = (path if path.is_absolute() else ROOT / path).resolve()
    return _count(path, path.stat().st_mtime_ns)  # read once per version of the file: the tables ask many times


@functools.lru_cache(maxsize=None)
def _count(path, _mtime_ns):
    rel = path.relative_to(ROOT).as_posix() if path.is_relative_to(ROOT) else str(path)
    counts = Counts(rel)
    optional_level = None  # the level of the optional section we are in, if any
    questions = set()
    for cell in json.loads(path.read_text())["cells"]:
        source = "".join(cell["source"])
        if cell["cell_type"] == "code":
            if optional_level is None:
                counts.main_code += 1
            else:
                counts.optional_code += 1
            continue
        if cell["cell_type"] != "markdown":
            continue
        fenced = False
        for line in source.splitlines():
            if line.lstrip().startswith("```"):
                fenced = not fenced
            heading = None if fenced else HEADING.match(line)
            if heading:
                level = len(heading[1])
                if optional_level is not None and level <= optional_level:
                    optional_level = None
                if optional_level is None and line.rstrip().endswith("(optional)"):
                    optional_level = level
            words = len(re.findall(r"\w+", line))
            if optional_level is None or counts.is_lab:
                counts.main_words += words
            else:
                counts.optional_words += words
        if counts.is_lab:
            questions.update(QUESTION.findall(source))
    counts.questions = len(questions)
    return counts


def notebooks():
    """Every chapter and every lab, in the table's order."""
    return ([p.relative_to(ROOT).as_posix() for p in sorted((ROOT / "chapters").glob("*.ipynb"))]
            + [p.relative_to(ROOT).as_posix() for p in sorted((ROOT / "labs").glob("*.ipynb"))])


def number(n):
    return f"{n:,}"


def instructors_table():
    """INSTRUCTORS.md's time table and the totals under it, as Markdown lines."""
    lines = ["| notebook | runs in (s) | load | main-path words | optional words | code cells (main + optional) "
             "| questions | study time: main path | optional sections |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for rel in notebooks():
        c = count(rel)
        seconds, load = MEASURED.get(rel, ("-", None))
        load = "-" if load is None else f"{load:.1f}"
        if c.is_lab:
            row = [rel, seconds, load, number(c.main_words), "-", c.main_code, c.questions, f"{c.main_minutes} min",
                   "-"]
        else:
            optional = f"{c.optional_minutes} min" if c.optional_words or c.optional_code else "-"
            row = [rel, seconds, load, number(c.main_words), number(c.optional_words),
                   f"{c.main_code} + {c.optional_code}", "-", f"{c.main_minutes} min", optional]
        lines.append("| " + " | ".join(map(str, row)) + " |")
    return lines + ["", totals_line()]


def hours(minutes):
    """'4 h 35 min', '5 h', '45 min'."""
    h, m = divmod(minutes, 60)
    return " ".join(part for part in (f"{h} h" if h else "", f"{m} min" if m or not h else "") if part)


def totals_line():
    """The sentence under INSTRUCTORS.md's table: chapters' main paths, their optional sections, labs."""
    counts = [count(rel) for rel in notebooks()]
    main = sum(c.main_minutes for c in counts if not c.is_lab)
    optional = sum(c.optional_minutes for c in counts if not c.is_lab)
    labs = sum(c.main_minutes for c in counts if c.is_lab)
    return (f"In all: {hours(main)} of chapters' main paths, {hours(optional)} of their optional sections and "
            f"{hours(labs)} of labs, before exercises.")


def title(rel):
    """A notebook's title: its first `# ` heading without the 'NN · ' prefix."""
    for cell in json.loads((ROOT / rel).read_text())["cells"]:
        found = re.search(r"^# (.*)", "".join(cell["source"]), re.M) if cell["cell_type"] == "markdown" else None
        if found:
            return re.sub(r"^(?:Lab )?\d\d · ", "", found[1]).strip()
    raise ValueError(f"{rel}: no '# ' title heading; every chapter starts with one")


def readme_table():
    """The README's chapter table, as Markdown lines."""
    labs = {pathlib.Path(rel).name[:2]: rel for rel in notebooks() if rel.startswith("labs/")}
    lines = ["| # | chapter | main path | optional | lab |", "|---|---|---:|---:|---|"]
    for rel in notebooks():
        if not rel.startswith("chapters/"):
            continue
        c, nn = count(rel), pathlib.Path(rel).name[:2]
        optional = f"{c.optional_minutes} min" if c.optional_words or c.optional_code else "-"
        lab = f"[lab {nn}]({labs[nn]}), {count(labs[nn]).main_minutes} min" if nn in labs else "-"
        lines.append(f"| {nn} | [{title(rel)}]({rel}) | {c.main_minutes} min | {optional} | {lab} |")
    return lines


def words_table():
    """Per chapter: main-path words, optional words, code cells, study time; over the limit marked."""
    lines = [f"{'chapter':48} {'main words':>10} {'optional':>9} {'code':>7} {'study (min)':>12}"]
    for rel in notebooks():
        if rel.startswith("chapters/"):
            c = count(rel)
            over = f"  over {MAIN_PATH_MAX_WORDS:,}" if c.main_words > MAIN_PATH_MAX_WORDS else ""
            lines.append(f"{rel:48} {c.main_words:>10,} {c.optional_words:>9,} {c.main_code:>3}+{c.optional_code:<3} "
                         f"{c.main_minutes:>5} + {c.optional_minutes:<4}{over}")
    return lines


ITEM = re.compile(r"(lab )?\b(\d\d)\b( optional)?[^(),;]*\((\d+)\)")


def syllabus(text, heading):
    """The weeks of the syllabus table under `heading` in text (INSTRUCTORS.md), each a dict:
    week, items [(kind, NN, stated minutes)] with kind 'chapter', 'lab' or 'optional', counted [items summed],
    stated (the week's total as written). Columns: week | chapters | labs due | study time | apart. A chapter is
    written `NN name (minutes)`, a lab `lab NN (minutes)`, optional sections `NN optional (minutes)`; the week's
    sum counts the chapters and labs of its columns 2 and 3, not what is apart. Every number in parentheses must
    be one of these items, so no stated time escapes the check."""
    section = text.split(heading, 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if re.match(r"\| \d+ \|", line)]
    weeks = []
    for row in rows:
        cells = [c.strip() for c in row.strip().strip("|").split("|")]
        if len(cells) != 5:
            raise ValueError(f"{heading}: a week has 5 columns (week, chapters, labs due, study time, apart): {row}")
        week, chapters, labs, total, apart = cells
        items, counted = [], []
        for column, cell in ((1, chapters), (2, labs), (4, apart)):
            found = [("lab" if lab else "optional" if optional else "chapter", nn, int(minutes))
                     for lab, nn, optional, minutes in ITEM.findall(cell)]
            if len(found) != len(re.findall(r"\(\d+\)", cell)):
                raise ValueError(f"{heading}, week {week}: a time in '{cell}' belongs to no `NN name (min)`, "
                                 "`lab NN (min)` or `NN optional (min)`")
            items += found
            counted += [item for item in found if column in (1, 2) and item[0] != "optional"]
        stated = re.match(r"(\d+) min", total)
        if not stated:
            raise ValueError(f"{heading}, week {week}: the study time column starts with 'N min': {total!r}")
        weeks.append({"week": int(week), "items": items, "counted": counted, "stated": int(stated[1])})
    return weeks


def item_minutes(kind, nn):
    """The rule's minutes for a syllabus item: a chapter's main path, its optional sections, or a lab."""
    folder = "labs" if kind == "lab" else "chapters"
    matches = sorted((ROOT / folder).glob(f"{nn}_*.ipynb"))
    if len(matches) != 1:
        raise ValueError(f"{kind} {nn}: {len(matches)} notebooks {folder}/{nn}_*.ipynb; want exactly one")
    c = count(matches[0])
    return c.optional_minutes if kind == "optional" else c.main_minutes


def weeks_table(path=ROOT / "INSTRUCTORS.md"):
    """Per syllabus week: what its table states and what the rule computes from the notebooks."""
    lines = []
    for heading in ("## A 6-week syllabus", "## A 10-week syllabus"):
        lines.append(heading[3:])
        for w in syllabus(path.read_text(), heading):
            computed = sum(item_minutes(kind, nn) for kind, nn, _ in w["counted"])
            lines.append(f"  week {w['week']:>2}: stated {w['stated']:>3} min, computed {computed:>3} min "
                         f"({hours(computed)}){'  OVER 5 h' if computed > WEEK_MAX_MINUTES else ''}")
    return lines


def write_tables():
    """Rewrite README's and INSTRUCTORS.md's generated tables in place (the syllabi stay as written: check them with
    `weeks`); the lines naming what changed."""
    changed = []
    for doc, lines in (("README.md", readme_table()), ("INSTRUCTORS.md", instructors_table())):
        text = (ROOT / doc).read_text().split("\n")
        if lines[0] not in text:
            raise SystemExit(f"{doc}: no line {lines[0]!r} to start the table at; paste the table in by hand once")
        start = text.index(lines[0])
        end = start
        while end < len(text) and text[end].startswith("|"):
            end += 1
        if doc == "INSTRUCTORS.md":  # the table, a blank line, the totals sentence
            end += 2
        if text[start:end] != lines:
            (ROOT / doc).write_text("\n".join(text[:start] + lines + text[end:]))
            changed.append(f"{doc}: table rewritten")
    return changed or ["both tables already match the notebooks"]


def main(argv):
    what = argv[0] if argv else "instructors"
    tables = {"instructors": instructors_table, "readme": readme_table, "words": words_table, "weeks": weeks_table,
              "write": write_tables}
    if what not in tables:
        raise SystemExit(f"unknown table {what!r}: pass one of {', '.join(tables)}")
    print("\n".join(tables[what]()))


if __name__ == "__main__":
    main(sys.argv[1:])
