"""The top-level documents: the README is a front page, each other file is named for its reader, and every relative
link opens a file (and a heading, for a #anchor). Fast: regular expressions over a few Markdown files.

Words are counted both ways, `re.findall(r"\\w+", text)` (the course's rule: "2.13.0" is 3 words, a link's path 3 or
more) and whitespace-separated (a table's `|` is a word), and the front page must fit under both.
"""
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
FRONT_PAGE_MAX_WORDS = 1000
# The files the README sends each reader to (DESIGN: one link away, named for their reader).
READERS = ("INSTALL.md", "GPU.md", "TESTING.md", "INSTRUCTORS.md", "GRADING.md")
DOCS = [README, *(ROOT / name for name in READERS)]
LINK = re.compile(r"(?<!\!)\[[^\]]*\]\(([^)\s]+)\)")


def words(text):
    """(\\w+ words, whitespace words) of a text."""
    return len(re.findall(r"\w+", text)), len(text.split())


def prose(path):
    """The file's lines outside ``` fences."""
    fenced, kept = False, []
    for line in path.read_text().splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
        elif not fenced:
            kept.append(line)
    return kept


def anchors(path):
    """The #anchors GitHub makes of a Markdown file's headings: lower case, punctuation dropped, spaces as '-'."""
    found = set()
    for line in prose(path):
        heading = re.match(r"#{1,6} (.*)", line)
        if heading:
            slug = re.sub(r"[^\w\- ]", "", heading[1].strip().lower()).replace(" ", "-")
            n = 1
            while (slug if n == 1 else f"{slug}-{n - 1}") in found:
                n += 1
            found.add(slug if n == 1 else f"{slug}-{n - 1}")
    return found


def test_readme_is_a_front_page():
    by_rule, by_space = words(README.read_text())
    assert max(by_rule, by_space) <= FRONT_PAGE_MAX_WORDS, (
        f"README.md has {by_rule} words (\\w+) and {by_space} (whitespace): a front page has at most "
        f"{FRONT_PAGE_MAX_WORDS}; move the detail to the file of its reader ({', '.join(READERS)})")


def test_readme_has_the_two_commands_and_links_every_reader():
    text = README.read_text()
    for command in ("make lab", "make test"):
        assert command in text, f"README.md does not show `{command}`"
    linked = set(LINK.findall(text))
    missing = [name for name in READERS if not any(t.split("#")[0] == name for t in linked)]
    assert not missing, f"README.md does not link {missing}"
    assert text.startswith("# "), "README.md starts with its title (make release adds its note under it)"


def test_instructors_links_grading():
    targets = LINK.findall((ROOT / "INSTRUCTORS.md").read_text())
    assert any(t.split("#")[0] == "GRADING.md" for t in targets), "INSTRUCTORS.md must link GRADING.md"


def broken_links(doc):
    """The relative links of doc that open no file, or no heading of it; URLs are not followed."""
    broken = []
    for line in prose(doc):
        for target in LINK.findall(line):
            if re.match(r"[a-z]+:", target):  # http:, https:, mailto:
                continue
            path, _, anchor = target.partition("#")
            file = (doc.parent / path).resolve() if path else doc
            if not file.exists():
                broken.append(f"{target}: no file {path}")
            elif anchor and file.suffix == ".md" and anchor not in anchors(file):
                broken.append(f"{target}: no heading #{anchor} in {file.name} (has {sorted(anchors(file))})")
    return broken


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_every_relative_link_resolves(doc):
    broken = broken_links(doc)
    assert not broken, f"{doc.name}: broken links:\n" + "\n".join(broken)


def test_a_broken_link_is_caught(tmp_path):
    doc = tmp_path / "doc.md"
    doc.write_text("# Title\n[ok](#title) [gone](missing.md) [no heading](#nowhere) [web](https://example.com/x)\n"
                   "```\n[in a fence](ignored.md)\n```\n")
    assert broken_links(doc) == ["missing.md: no file missing.md",
                                 "#nowhere: no heading #nowhere in doc.md (has ['title'])"]


def test_anchor_slugs_follow_github(tmp_path):
    """The slug rule on headings this repository uses (GitHub drops punctuation, keeps '-' and '_')."""
    made = tmp_path / "slug-check.md"
    made.write_text("# Lab 10's report: the rubric\n## `make gpu-check`\n## What `make setup` installs: x\n## Time\n"
                    "## Time\n")
    assert anchors(made) == {"lab-10s-report-the-rubric", "make-gpu-check", "what-make-setup-installs-x", "time",
                             "time-1"}
