"""INSTRUCTORS.md covers every chapter and lab; the answer key has one entry per exercise of each notebook."""
import json
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
GUIDE = ROOT / "INSTRUCTORS.md"
ANSWERS = ROOT / "solutions" / "ANSWERS.md"
CHAPTERS = sorted((ROOT / "chapters").glob("*.ipynb"))
LABS = sorted((ROOT / "solutions").glob("*.ipynb"))
ENTRY = re.compile(r"^\*\*((?:ch|lab)\d\d\.\d+)\*\*", re.M)


def exercises(path):
    """The numbered items of the notebook's "## Exercises" section (top-level `1.`, `2.`, ... lines)."""
    cells = json.loads(path.read_text())["cells"]
    for cell in cells:
        text = "".join(cell["source"])
        if cell["cell_type"] == "markdown" and re.search(r"^## Exercises\s*$", text, re.M):
            section = re.split(r"^## Exercises\s*$", text, flags=re.M)[1]
            # up to the next heading of the same or a higher level; a "### ... (optional)" part keeps its numbers
            section = re.split(r"^#{1,2} ", section, flags=re.M)[0]
            return [int(n) for n in re.findall(r"^(\d+)\. ", section, re.M)]
    return []


def expected_entries():
    keys = [f"ch{p.name[:2]}.{n}" for p in CHAPTERS for n in exercises(p)]
    return keys + [f"lab{p.name[:2]}.{n}" for p in LABS for n in exercises(p)]


def test_every_notebook_has_exercises_numbered_from_one():
    for path in CHAPTERS + LABS:
        numbers = exercises(path)
        assert numbers and numbers == list(range(1, len(numbers) + 1)), (
            f"{path.relative_to(ROOT)}: exercises numbered {numbers}; want 1..n in an '## Exercises' section")


def test_answer_key_has_one_entry_per_exercise():
    found = ENTRY.findall(ANSWERS.read_text())
    expected = expected_entries()
    duplicates = sorted({k for k in found if found.count(k) > 1})
    assert not duplicates, f"{ANSWERS.name}: entries answered twice: {duplicates}"
    missing, extra = sorted(set(expected) - set(found)), sorted(set(found) - set(expected))
    assert not missing, f"{ANSWERS.name}: no answer for {missing}; add a '**key** ...' paragraph each"
    assert not extra, f"{ANSWERS.name}: answers for exercises no notebook has: {extra} (renumbered?)"
    assert len(expected) >= 100, f"only {len(expected)} exercises found: is the parsing broken?"


def test_answer_key_is_not_released_to_students():
    assert ANSWERS.parent.name == "solutions", "the answer key lives with the solutions, not in the release"
    assert "solutions/ANSWERS.md" in GUIDE.read_text(), "INSTRUCTORS.md must say where the answer key is"


@pytest.mark.parametrize("path", CHAPTERS + LABS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_guide_covers_every_notebook(path):
    guide = GUIDE.read_text()
    kind = "chapters" if path.parent.name == "chapters" else "labs"
    assert f"{kind}/{path.name}" in guide, f"INSTRUCTORS.md does not mention {kind}/{path.name}"


def test_guide_has_outcomes_times_syllabi_and_the_term():
    guide = GUIDE.read_text()
    for heading in ("## Learning outcomes", "## Time", "## A 6-week syllabus", "## A 10-week syllabus",
                    "## Running a term"):
        assert heading in guide, f"INSTRUCTORS.md has no '{heading}' section"
    assert "scripts/time_notebooks.py" in guide, "measured times come with the command that measured them"
    assert (ROOT / "README.md").read_text().count("INSTRUCTORS.md") >= 1, "README must link INSTRUCTORS.md"
