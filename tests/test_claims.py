"""Every reference in the course's text points at something a reader can open.

Text = the markdown cells and code comments of chapters/, solutions/ and labs/ notebooks (outputs are not read),
the top-level Markdown files (README.md and the files it links: INSTALL, GPU, TESTING, INSTRUCTORS, GRADING)
and the Markdown files under solutions/ and chapters/. Fast: JSON and regular
expressions, no kernel, no torch import.

The reference formats the test parses, and what each must satisfy:
- a path of this repository, `helpers/...`, `chapters/...`, `labs/...`, `solutions/...`, `tests/...`,
  `scripts/...` (a leading `../` is allowed): it exists in the checkout. `NN` (two digits), `topic` and `...`
  are placeholders (`labs/NN_topic.ipynb`); `artifacts/...` is output that the tests write, not shipped.
- a `Name.md` file: the repository ships a file of that name, or its own code (helpers/, scripts/) writes one.
- a file of the installed torch, `torch/nn/parallel/distributed.py`: it exists in this venv's torch (2.13).
  C++ sources are not installed: cite them as another repository's file, below.
- a file of another repository: `owner/repo:path@commit`, the commit 7 to 40 hex digits, e.g.
  `huggingface/picotron:picotron/data_parallel/data_parallel.py@d0efdcc188a4`. A GitHub blob/tree URL
  must name a commit too, not a branch.
- a paper: authors, year and `arXiv NNNN.NNNNN` (with the section or table where the figure is).
Notes kept outside the repository (the names in TEAM_NOTES) are never a reference, in the course or in the code:
cite the primary source they point to. test_a_planted_bad_reference_is_caught proves each rule fails on a bad string.
"""
import importlib.util
import json
import pathlib
import re
import time

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
TORCH = pathlib.Path(importlib.util.find_spec("torch").submodule_search_locations[0])
NOTEBOOKS = sorted(p for d in ("chapters", "solutions", "labs") for p in (ROOT / d).glob("*.ipynb"))
MARKDOWN = [*sorted(ROOT.glob("*.md")),
            *sorted((ROOT / "solutions").glob("*.md")), *sorted((ROOT / "chapters").rglob("*.md"))]
SHIPPED_MD = {p.name for p in ROOT.rglob("*.md") if not {".venv", "artifacts", "build"} & set(p.parts)}
# ... or written by the repository's own tools (a report, a release's manifest): named in their source.
WRITTEN_MD = {name for p in [*(ROOT / "helpers").rglob("*.py"), *(ROOT / "scripts").glob("*.py"), ROOT / "Makefile"]
              for name in re.findall(r"[\w\-]+\.md\b", p.read_text())}

ROOTS = "helpers|chapters|labs|solutions|tests|scripts|artifacts|shared"
NOT_IN_A_PATH = r"(?<![\w./:@\-])"  # not the tail of a URL, of owner/repo:path or of another path
REPO_PATH = re.compile(NOT_IN_A_PATH + r"(?:\.\./)*((?:" + ROOTS + r")/[\w./*\-]*)")
TORCH_PATH = re.compile(NOT_IN_A_PATH + r"(torch/[\w./\-]+)")
OTHER_REPO = re.compile(NOT_IN_A_PATH + r"([A-Za-z0-9][\w.\-]*/[\w.\-]+):([\w\-]+(?:[./][\w\-]+)+)(@[0-9A-Za-z]*)?")
GITHUB_URL = re.compile(r"https?://github\.com/[\w.\-]+/[\w.\-]+/(?:blob|tree)/([^/\s]+)/")
MD_NAME = re.compile(r"(?<![\w\-/.])([\w\-]+\.md)\b")
# NNNN.NNNNN: the form, in prose; an arxiv.org/abs/ or /pdf/ address with its id is a reference too
ARXIV = re.compile(r"arXiv(?!\s*:?\s*(?:\d{4}\.\d{4,5}|NNNN\.NNNNN)|\.org/(?:abs|pdf)/\d{4}\.\d{4,5})", re.I)
TEAM_NOTES = re.compile(r"\b(?:FACTS|STYLE|DESIGN)\.md\b|\bFACTS\b(?!\.md)|(?<![\w/])shared/")
HEX_COMMIT = re.compile(r"@[0-9a-f]{7,40}")
TRAILING = ".,;:)`'\"*"


def notebook_text(path):
    """Markdown cells whole, code cells' comments only: what the notebook says, not what it computes."""
    parts = []
    for cell in json.loads(path.read_text())["cells"]:
        source = "".join(cell["source"])
        if cell["cell_type"] == "markdown":
            parts.append(source)
        elif cell["cell_type"] == "code":
            parts += [line.split("#", 1)[1] for line in source.splitlines() if "#" in line]
    return "\n".join(parts)


def repo_path_exists(path):
    """A path of this repository exists; NN, topic and ... are placeholders; artifacts/ is test output."""
    path = path.rstrip(TRAILING)
    if path.startswith("artifacts/"):
        return True
    if not re.search(r"NN|topic|\.\.\.|\*", path):
        return (ROOT / path).exists()
    pattern = path.replace("...", "*").replace("NN", "[0-9][0-9]").replace("topic", "*").rstrip("/")
    return any(ROOT.glob(pattern)) or any(ROOT.glob(pattern + "*"))  # `labs/NN` names labs/07_zero_1_and_2...


def problems(text):
    """What is wrong with the references in `text`, one line each (an empty list: nothing)."""
    found = []
    for m in TEAM_NOTES.finditer(text):
        found.append(f"{m.group(0)!r}: a team note the repository does not ship; cite the primary source")
    for m in REPO_PATH.finditer(text):
        if not repo_path_exists(m.group(1)):
            found.append(f"{m.group(1).rstrip(TRAILING)!r}: no such path in this repository")
    for m in TORCH_PATH.finditer(text):
        path = m.group(1).rstrip(TRAILING)
        if not (TORCH.parent / path).exists():
            found.append(f"{path!r}: not a file of the installed torch; cite C++ or other versions as "
                         f"pytorch/pytorch:{path}@<commit>")
    for m in OTHER_REPO.finditer(text):
        if m.group(1).split("/")[0] in ROOTS.split("|") or m.group(1).startswith("torch/"):
            continue
        commit = m.group(3) or ""
        if not HEX_COMMIT.fullmatch(commit):
            found.append(f"{m.group(0)!r}: another repository's file needs a commit, owner/repo:path@<7-40 hex>")
    for m in GITHUB_URL.finditer(text):
        if not re.fullmatch(r"[0-9a-f]{7,40}", m.group(1)):
            found.append(f"{m.group(0)!r}: a GitHub link must name a commit, not the branch {m.group(1)!r}")
    for m in MD_NAME.finditer(text):
        if m.group(1) not in SHIPPED_MD | WRITTEN_MD and not TEAM_NOTES.fullmatch(m.group(1)):
            found.append(f"{m.group(1)!r}: the repository ships no file of that name")
    for m in ARXIV.finditer(text):
        found.append(f"{text[m.start():m.start() + 30]!r}: an arXiv reference needs its id, arXiv NNNN.NNNNN")
    return found


@pytest.mark.parametrize("path", NOTEBOOKS + MARKDOWN, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_reference_resolves(path):
    text = notebook_text(path) if path.suffix == ".ipynb" else path.read_text()
    found = problems(text)
    assert not found, f"{path.relative_to(ROOT)}: fix these references:\n  " + "\n  ".join(found)


def test_no_code_or_docstring_names_a_team_note():
    for path in sorted(p for d in ("helpers", "tests", "scripts") for p in (ROOT / d).rglob("*.py")):
        if path.name != "test_claims.py":  # this file names them on purpose
            notes = TEAM_NOTES.findall(path.read_text())
            assert not notes, f"{path.relative_to(ROOT)} names {notes}: cite the primary source, or say it here"


@pytest.mark.parametrize("bad", [
    "the verified figures (FACTS.md)",
    "FACTS (ZeRO paper, section 7): DDP all-reduces",
    "as STYLE.md says",
    "see DESIGN.md",
    "../shared/FACTS.md lists the sources",
    "the hook lives in `helpers/no_such_module.py`",
    "chapter `chapters/42_missing.ipynb`",
    "`torch/csrc/distributed/c10d/ProcessGroupGloo.cpp`",
    "`torch/nn/parallel/no_such_file.py`",
    "huggingface/picotron:picotron/data_parallel/data_parallel.py",
    "huggingface/picotron:picotron/data_parallel/data_parallel.py@main",
    "https://github.com/pytorch/pytorch/blob/main/benchmarks/distributed/ddp/README.md",
    "the ZeRO paper (arXiv, section 7)",
    "the paper, https://arxiv.org/abs/, section 3",
])
def test_a_planted_bad_reference_is_caught(bad):
    assert problems(f"Some text, then {bad}, and more text.\n") != []


def test_good_references_pass():
    good = ("`helpers/comm.py`, `chapters/capstone/train_gpt.py`, `labs/NN_topic.ipynb`, `artifacts/browser/`, "
            "`torch/nn/parallel/distributed.py`, "
            "`huggingface/picotron:picotron/data_parallel/data_parallel.py@d0efdcc188a4`, "
            "`pytorch/pytorch:torch/csrc/distributed/c10d/ProcessGroupGloo.cpp@c194358a8ee4`, "
            "Rajbhandari et al. 2020, arXiv 1910.02054, section 7.2; see INSTRUCTORS.md; "
            "https://arxiv.org/abs/1905.13727; "
            "https://download.pytorch.org/whl/cpu")
    assert problems(good) == []


def test_fast():
    start = time.perf_counter()
    for path in NOTEBOOKS + MARKDOWN:
        problems(notebook_text(path) if path.suffix == ".ipynb" else path.read_text())
    assert time.perf_counter() - start < 5.0


# A paper is cited as "Author et al. YEAR, arXiv NNNN.NNNNN" (or with its two or three authors' names). One first
# author and year is one paper everywhere, unless listed here with every id it may stand for: the two papers of
# Narayanan et al. 2021 (PipeDream-Flush; Megatron-LM at scale). KNOWN pins the ids of the papers chapter 14 cites
# (the pipeline, context- and expert-parallel sources) and of the ZeRO paper: changing one is an edit made here.
CITATION = re.compile(r"\b([A-Z][a-z]+)(?: et al\.|(?:, [A-Z][a-z]+)* and [A-Z][a-z]+)? ((?:19|20)\d\d), "
                      r"arXiv (\d{4}\.\d{4,5})")
SEVERAL = {("Narayanan", "2021"): {"2006.09503", "2104.04473"}}
KNOWN = {("Huang", "2019"): "1811.06965", ("Lepikhin", "2020"): "2006.16668", ("Fedus", "2021"): "2101.03961",
         ("Liu", "2023"): "2310.01889", ("Qi", "2024"): "2401.10241", ("Rajbhandari", "2020"): "1910.02054"}


def citations(paths):
    """{(first author, year): {arXiv id: [files]}} over the course's text, line breaks read as spaces."""
    found = {}
    for path in paths:
        text = notebook_text(path) if path.suffix == ".ipynb" else path.read_text()
        for author, year, arxiv in CITATION.findall(re.sub(r"\s+", " ", text)):
            name = path.relative_to(ROOT).as_posix() if path.is_relative_to(ROOT) else path.name
            found.setdefault((author, year), {}).setdefault(arxiv, []).append(name)
    return found


def test_one_paper_one_arxiv_id():
    found = citations(NOTEBOOKS + MARKDOWN)
    for key, arxiv in KNOWN.items():
        assert key in found, f"{key[0]} {key[1]} is no longer cited as 'arXiv {arxiv}': update KNOWN"
    for (author, year), ids in found.items():
        allowed = SEVERAL.get((author, year)) or {KNOWN.get((author, year), next(iter(ids)))}
        wrong = {i: files for i, files in ids.items() if i not in allowed}
        assert not wrong, (f"{author} et al. {year} is cited with other arXiv ids than {sorted(allowed)}: {wrong}; "
                           "fix the id, or list the author's papers of that year in SEVERAL")


def test_a_second_id_for_one_paper_is_caught(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("GPipe (Huang et al. 2019, arXiv 1811.06965, section 2) and again (Huang et al.\n2019, "
                    "arXiv 1811.06966).")
    assert citations([page]) == {("Huang", "2019"): {"1811.06965": [page.name], "1811.06966": [page.name]}}
