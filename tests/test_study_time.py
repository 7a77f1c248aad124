"""Study time by INSTRUCTORS.md's rule (scripts/study_time.py): main paths fit one sitting, the tables that state
the times are the script's, and no syllabus week is above WEEK_MAX_MINUTES. Fast: JSON and regular expressions."""
import importlib.util
import json
import pathlib

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
