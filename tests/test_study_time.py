"""Study time by INSTRUCTORS.md's rule (scripts/study_time.py): main paths fit one sitting, the tables that state
the times are the script's, and no syllabus week is above WEEK_MAX_MINUTES. Fast: JSON and regular expressions."""
import importlib.util
import json
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("study_time", ROOT / "scripts" / "study_time.py")
study_time = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(study_time)

CHAPTERS = [rel for rel in study_time.notebooks() if rel.startswith("chapters/")]


def cells(*blocks):
    """A notebook's cells from (cell_type, source) pairs."""
    return {"cells": [{"cell_type": kind, "source": source, "metadata": {}} for kind, source in blocks]}


def test_optional_sections_are_counted_apart(tmp_path):
    """The convention on a made-up chapter: a section ends at a heading of its level or higher, not a deeper one."""
    notebook = cells(("markdown", "# Title\none two"),
                     ("code", "x = 1"),
                     ("markdown", "## 2. Deep dive (optional)\nthree four five\n### Calibration\nsix"),
                     ("code", "y = 2"),
                     ("markdown", "```\n# a comment in a fence, not a heading\n```\n"
                                  "## 3. Back on the main path\nseven"),
                     ("code", "z = 3"),
                     ("markdown", "### Detail (optional)\neight\n## 4. Main\nnine"))
    path = tmp_path / "chapter.ipynb"
    path.write_text(json.dumps(notebook))
    c = study_time.count(path)
    # main: "Title one two" 3, "3 Back on the main path seven" 7, "4 Main nine" 3
    assert (c.main_words, c.main_code) == (13, 2), c
    # optional: "2 Deep dive optional three four five" 7, "Calibration six" 2,
    # the fence 8 ("a comment in a fence not a heading", "```" none), "Detail optional eight" 3
    assert (c.optional_words, c.optional_code) == (7 + 2 + 8 + 3, 1), c


def test_the_rule_rounds_to_five_minutes():
    assert study_time.study_minutes(2581, 30) == 70  # 25.81 + 45 = 70.81
    assert study_time.study_minutes(1200, 9, questions=3) == 100  # 12 + 90; a lab's code cells are its questions'
    assert study_time.study_minutes(250, 0) == 5  # 2.5 rounds half up
    assert study_time.study_minutes(0, 0) == 0


def test_every_main_path_fits_one_sitting():
    """Every chapter's main path <= MAIN_PATH_MAX_WORDS markdown words; the table is printed (-s) and in the message."""
    table = "\n".join(study_time.words_table())
    print("\n" + table)
    over = [rel for rel in CHAPTERS if study_time.count(rel).main_words > study_time.MAIN_PATH_MAX_WORDS]
    assert not over, (f"main path above {study_time.MAIN_PATH_MAX_WORDS:,} words in {over}: mark deep dives "
                      f"'(optional)' at their heading (the convention is in scripts/study_time.py)\n{table}")


def block_in(doc, lines):
    """The lines of doc from the first line of `lines` on, as many as `lines` has (None if that line is absent)."""
    text = (ROOT / doc).read_text().splitlines()
    if lines[0] not in text:
        return None
    start = text.index(lines[0])
    return text[start:start + len(lines)]


@pytest.mark.parametrize("doc, table", [("INSTRUCTORS.md", "instructors"), ("README.md", "readme")])
def test_the_stated_study_times_are_the_rules(doc, table):
    """INSTRUCTORS.md's time table and the README's chapter table are what the script prints from the notebooks."""
    expected = getattr(study_time, f"{table}_table")()
    found = block_in(doc, expected)
    fix = (f"run `.venv/bin/python scripts/study_time.py write` (or paste the output of `... study_time.py {table}` "
           f"into {doc}); then `... study_time.py weeks` says which syllabus week's times to update")
    assert found is not None, f"{doc}: no table starting with {expected[0]!r}; {fix}"
    diff = [f"{doc}: {a}\n   now: {b}" for a, b in zip(found, expected) if a != b]
    assert found == expected, "the notebooks changed since the table was made:\n" + "\n".join(diff) + f"\n{fix}"


SYLLABI = {"## A 6-week syllabus": 6, "## A 10-week syllabus": 10}


@pytest.mark.parametrize("heading", SYLLABI)
def test_every_syllabus_week_fits_five_hours(heading):
    """Each week's chapters (main paths) + labs due <= WEEK_MAX_MINUTES by the rule; every time it states is the rule's,
    its sum is the week's stated time, and a lab is due no earlier than the week its chapter is read."""
    weeks = study_time.syllabus((ROOT / "INSTRUCTORS.md").read_text(), heading)
    assert [w["week"] for w in weeks] == list(range(1, SYLLABI[heading] + 1)), f"{heading}: weeks {weeks}"
    read_in = {}
    problems = []
    for w in weeks:
        for kind, nn, stated in w["items"]:
            minutes = study_time.item_minutes(kind, nn)
            if stated != minutes:
                problems.append(f"week {w['week']}: {kind} {nn} stated {stated} min, the rule gives {minutes}")
            if kind == "chapter":
                read_in.setdefault(nn, w["week"])
        computed = sum(study_time.item_minutes(kind, nn) for kind, nn, _ in w["counted"])
        if w["stated"] != computed:
            problems.append(f"week {w['week']}: states {w['stated']} min, its chapters and labs sum to {computed}")
        if computed > study_time.WEEK_MAX_MINUTES:
            problems.append(f"week {w['week']}: {computed} min, above {study_time.WEEK_MAX_MINUTES}")
        for kind, nn, _ in w["counted"]:
            if kind == "lab" and read_in.get(nn, 99) > w["week"]:
                problems.append(f"week {w['week']}: lab {nn} due before chapter {nn} is read")
    print("\n" + "\n".join(study_time.weeks_table()))
    assert not problems, f"INSTRUCTORS.md, {heading[3:]}:\n" + "\n".join(problems)


def test_the_ten_week_plan_reads_chapters_12_and_13():
    weeks = study_time.syllabus((ROOT / "INSTRUCTORS.md").read_text(), "## A 10-week syllabus")
    read = {nn for w in weeks for kind, nn, _ in w["counted"] if kind == "chapter"}
    assert {"12", "13"} <= read, f"the 10-week plan reads chapters {sorted(read)}; 12 and 13 belong in it"


def test_a_stray_time_in_a_syllabus_is_refused():
    text = ("## A 6-week syllabus\n| week | chapters | labs due | study time | apart |\n|---|---|---|---|---|\n"
            "| 1 | 00 first (70), a break (20) | lab 01 (100) | 170 min | 05 optional (30) |\n")
    with pytest.raises(ValueError, match="belongs to no"):
        study_time.syllabus(text, "## A 6-week syllabus")
    week = study_time.syllabus(text.replace(", a break (20)", ""), "## A 6-week syllabus")[0]
    assert week["counted"] == [("chapter", "00", 70), ("lab", "01", 100)]
    assert ("optional", "05", 30) in week["items"] and week["stated"] == 170
