"""The similarity report (helpers/grading/report/similarity.py): copied answers flagged, honest and starter-only ones
not.

No kernel runs: the fixture lab 97 is built on disk and its submissions only read."""
import copy
import csv
import json
import pathlib
import time

import nbformat
import pytest

from helpers.grading.report import similarity, similarity_report
from tests.grading import fixture_lab as lab

pytestmark = pytest.mark.timeout(60)
ROOT = pathlib.Path(__file__).resolve().parents[2]

# Honest answers to 97.2, each written its own way.
HONEST = {
    "reduce": lab.RANK_SUM.replace("### BEGIN SOLUTION (lab 97.2) all_reduce each rank's id\n", "")
                          .replace("    ### END SOLUTION\n", ""),
    "formula": '''import torch
import torch.distributed as dist
from helpers import launch

def rank_sum(world_size):
    """Sum of the ranks 0..world_size-1, computed with an all_reduce on world_size ranks."""
    def body():
        rank = dist.get_rank()
        total = torch.zeros(1)
        total += rank
        dist.all_reduce(total, op=dist.ReduceOp.SUM)
        assert int(total.item()) == world_size * (world_size - 1) // 2, "wrong sum"
        return total.item()
    results = launch(body, world_size)
    return results[0]
''',
    "sends": '''import torch
import torch.distributed as dist
from helpers import launch

def rank_sum(world_size):
    """Sum of the ranks 0..world_size-1, computed with an all_reduce on world_size ranks."""
    def ring():
        value = torch.tensor([dist.get_rank()], dtype=torch.float64)
        if dist.get_rank() == 0:
            for source in range(1, dist.get_world_size()):
                incoming = torch.empty_like(value)
                dist.recv(incoming, src=source)
                value += incoming
        else:
            dist.send(value, dst=0)
        dist.broadcast(value, src=0)
        return value.item()
    return launch(ring, world_size)[0]
''',
}


def _class(tmp_path, answers, extra=()):
    """Lab 97 on disk and one submission per student {student: 97.2 source}; returns (released lab, paths)."""
    lab.build(tmp_path)
    paths = {s: lab.submission(tmp_path, s, None, source) for s, source in answers.items()}
    released = nbformat.read(tmp_path / "labs" / "97_fixture.ipynb", as_version=4)
    return released, {**paths, **dict(extra)}


def _pairs(tmp_path, answers, extra=()):
    released, paths = _class(tmp_path, answers, extra)
    pairs = similarity_report.write(tmp_path, "97", released, paths)
    return {(p.question, p.a.student, p.b.student) for p in pairs}, (tmp_path / "similarity.md").read_text()


def test_a_renamed_reformatted_copy_is_flagged_and_honest_answers_are_not(tmp_path):
    pairs, text = _pairs(tmp_path, {**HONEST, "alice": lab.GATHER_SUM, "bob": lab.GATHER_SUM_COPIED})
    assert pairs == {("97.2", "alice", "bob")}
    assert "| 1 | 97.2 | alice | bob |" in text
    assert "not a verdict" in text and "dist.all_gather(parts, t); return" in text  # both answers shown
    with open(tmp_path / "similarity.csv") as f:
        [row] = list(csv.DictReader(f))
    assert (row["student_a"], row["student_b"], row["a_tokens"], row["b_tokens"]) == ("alice", "bob", "88", "88")
    assert float(row["score"]) > 0.8  # every token alike but the few the class has in common


def test_the_copy_scores_far_above_every_honest_pair(tmp_path):
    released, paths = _class(tmp_path, {**HONEST, "alice": lab.GATHER_SUM, "bob": lab.GATHER_SUM_COPIED})
    found = similarity.read_class(released, paths)
    _, scores, _ = similarity.compare(found.answers["97.2"], found.starters["97.2"])
    copied = scores.pop(("alice", "bob"))
    # The closest honest pairs share a line or two (`return launch(V, world_size, hang_timeout=5)[0]`).
    assert max(scores.values()) < similarity.FLAG - 0.1 and copied > similarity.FLAG + 0.3, scores


def test_the_starter_code_alone_is_never_compared(tmp_path):
    lab.build(tmp_path)
    released = nbformat.read(tmp_path / "labs" / "97_fixture.ipynb", as_version=4)
    starter = released.cells[4].source
    pairs, text = _pairs(tmp_path, {"ann": starter, "ben": starter, "cat": starter + "\n# started, not done\n"})
    assert not pairs and "No pair of answers reached the listing score" in text
    found = similarity.read_class(released, {s: tmp_path / "submissions" / f"{s}.ipynb" for s in ("ann", "cat")})
    assert [a.tokens for a in found.answers["97.2"]] == [(), ()]  # nothing of the starter is the student's


def test_a_solution_most_of_the_class_writes_flags_no_one(tmp_path):
    # The same idiom in 5 of 6 answers is the common solution (over max(COMMON_MIN, 10 %) of the class).
    pairs, _ = _pairs(tmp_path, {**{f"s{i}": HONEST["reduce"] for i in range(5)}, "other": HONEST["sends"]})
    assert not pairs


def test_bad_input_is_a_note_not_a_crash(tmp_path):
    lab.build(tmp_path)
    garbage = tmp_path / "submissions" / "garbage.ipynb"
    garbage.write_text("{ not a notebook")
    half = tmp_path / "submissions" / "half.ipynb"
    half.write_text('{"cells": [], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}')  # another notebook
    unbalanced = "def rank_sum(world_size):\n    return launch(f, world_size, [\n"  # tokenize stops at the end
    answers = {"empty": "", "unbalanced": unbalanced, "alice": lab.GATHER_SUM, "bob": lab.GATHER_SUM_COPIED}
    pairs, text = _pairs(tmp_path, answers, extra={"garbage": garbage, "half": half})
    assert pairs == {("97.2", "alice", "bob")}
    assert "- garbage: not a readable notebook" in text
    assert "lab 97.1: no answer cell found for" in text and "half" in text


def test_report_rows_say_what_each_column_counts(tmp_path):
    pairs, text = _pairs(tmp_path, {"alice": lab.GATHER_SUM, "bob": lab.GATHER_SUM_COPIED, "carol": lab.GATHER_SUM})
    assert pairs == {("97.2", "alice", "bob"), ("97.2", "alice", "carol"), ("97.2", "bob", "carol")}
    assert "## The 3 most alike, answer by answer" in text
    assert ">" in text.split("### 1.")[1].split("```")[1]  # matched lines are marked


def test_tokens_ignore_what_copying_changes():
    vocabulary = {"dist", "torch", "world_size"}
    one = "x = dist.all_reduce(t)  # sum\nreturn x / world_size\n"
    two = "total=dist.all_reduce( t2 )\n\n\nreturn total/world_size"
    names = similarity.bound_names
    assert ([t for t, _ in similarity.normalise(one, names(one), vocabulary)]
            == [t for t, _ in similarity.normalise(two, names(two), vocabulary)]
            == ["V", "=", "dist", ".", "all_reduce", "(", "V", ")", ";", "return", "V", "/", "world_size", ";"])


def test_winnowing_is_deterministic_and_finds_every_long_shared_run():
    tokens = tuple(f"t{i}" for i in range(40))
    chosen = similarity.winnow(similarity.kgram_hashes(tokens))
    assert chosen == similarity.winnow(similarity.kgram_hashes(tokens))
    # Every window of WINDOW consecutive k-grams holds a chosen one: a shared run of K + WINDOW - 1 tokens is found.
    positions = sorted(p for ps in chosen.values() for p in ps)
    assert all(any(s <= p < s + similarity.WINDOW for p in positions) for s in range(len(tokens) - similarity.K - 2))


def test_an_answer_that_breaks_the_parser_is_still_compared(tmp_path):
    # ast.parse raises RecursionError on a sum of 5,000 terms (MemoryError on 6,000 unary minuses).
    deep = f"def rank_sum(world_size):\n    return {'+'.join(['1'] * 5000)}\n"
    with pytest.raises(RecursionError):
        similarity.ast.parse(deep)
    pairs, text = _pairs(tmp_path, {"deep": deep, "deep_too": deep, "alice": lab.GATHER_SUM})
    assert pairs == {("97.2", "deep", "deep_too")}


def test_a_failed_report_leaves_the_grades_and_says_so(tmp_path, monkeypatch, capsys):
    from helpers.grading import grade

    def broken(*args):
        raise OSError("disk full")

    (tmp_path / "logs").mkdir()
    monkeypatch.setattr(similarity_report, "write", broken)
    grade._write_similarity(tmp_path, "97", None, {})
    why = "the similarity report failed (OSError: disk full); grades.csv is complete"
    assert f"grade: {why}" in capsys.readouterr().err
    assert why in (tmp_path / "logs" / "grader.log").read_text()


def _report(tmp_path, answers, solution=True, edits=None):
    """similarity.md and the csv's rows of lab 97's class {student: 97.2 source}; edits: {student: notebook edit}."""
    lab.build(tmp_path)
    paths = {s: lab.submission(tmp_path, s, None, source, (edits or {}).get(s)) for s, source in answers.items()}
    released = nbformat.read(tmp_path / "labs" / "97_fixture.ipynb", as_version=4)
    similarity_report.write(tmp_path, "97", released, paths,
                            tmp_path / "solutions" / "97_fixture.ipynb" if solution else None)
    with open(tmp_path / "similarity.csv") as f:
        return (tmp_path / "similarity.md").read_text(), list(csv.DictReader(f))


def _markdown_cell(text):
    def edit(nb):
        nb.cells.append(nbformat.v4.new_markdown_cell(text))
    return edit


def test_identical_submissions_come_first_whatever_the_class_shares(tmp_path):
    # Five answers alike: the common filter pairs none of them. Two are one file, byte for byte; the other three
    # differ only outside the answer cells, and one of those reformatted and renamed its answer.
    renamed = HONEST["formula"].replace("total", "acc").replace("        rank = ", "        rank=")
    answers = {"ann": HONEST["formula"], "bea": HONEST["formula"], "cid": HONEST["formula"],
               "dan": HONEST["formula"], "eve": renamed, "sol": HONEST["sends"]}
    text, rows = _report(tmp_path, answers, edits={s: _markdown_cell(s) for s in ("cid", "dan", "eve")})
    assert "| 1 | ann, bea | the same file, byte for byte |" in text
    assert "| 2 | ann, bea, cid, dan, eve | the same code in every answer" in text
    assert text.index("## Identical submissions") < text.index("## Copies of the published solution") < text.index(
        "## Pairs")
    assert [(r["kind"], r["student_a"], r["student_b"]) for r in rows][:2] == [
        ("identical_file", "ann", "bea"), ("identical_answers", "ann", "bea")]
    assert not [r for r in rows if r["kind"] == "alike"]  # the common filter still decides the pairs


def test_the_released_lab_handed_in_twice_is_not_a_copy(tmp_path):
    text, rows = _report(tmp_path, {"ann": None, "bea": None, "cid": HONEST["sends"]})
    assert "No two submissions are identical" in text and not rows


def test_a_pasted_solution_is_listed_under_its_own_heading(tmp_path):
    # Four students paste the published solution's 97.2 (one reformats it): common in the class, so no pair is
    # listed, but each is a copy of the solution; the honest answers are not.
    pasted = lab.RANK_SUM.replace("    ### BEGIN SOLUTION (lab 97.2) all_reduce each rank's id\n", "") \
                         .replace("    ### END SOLUTION\n", "")
    reformatted = pasted.replace("t = torch.tensor", "value = torch.tensor").replace("(t)", "(value)") \
                        .replace("t.item()", "value.item()").replace("world_size, hang", "world_size,\n        hang")
    answers = {"p1": lab.RANK_SUM, "p2": pasted, "p3": pasted, "p4": reformatted, **HONEST}
    text, rows = _report(tmp_path, answers, edits={s: _markdown_cell(s) for s in answers})
    section = text.split("## Copies of the published solution")[1].split("\n## ")[0]
    listed = {line.split(" | ")[1]: line for line in section.splitlines() if line.startswith("| 97.2 |")}
    assert set(listed) == {"p1", "p2", "p3", "p4", "reduce"}, section  # "reduce" is the solution's loop too
    assert all(" | 1.00 | yes | " in line for line in listed.values())
    assert {r["student_a"] for r in rows if r["kind"] == "solution"} == set(listed)
    assert not [r for r in rows if r["kind"] == "alike"]
    assert "| 97.2 | 7 | 7 | " in text and text.split("| 97.2 | 7 | 7 | ")[1].split("\n")[0].endswith("| 5 |")


def test_without_a_solution_the_report_says_so(tmp_path):
    text, _ = _report(tmp_path, {"ann": lab.RANK_SUM, "bea": HONEST["sends"]}, solution=False)
    assert "Not compared: no published solution was given." in text


def test_a_huge_answer_costs_a_bounded_time_and_is_named(tmp_path):
    # 2.4 MB of statements in each of two answers: read whole, this report took 14.4 CPU-s; cut at MAX_ANSWER_CHARS,
    # 0.55 (notebooks written included).
    huge = lab.RANK_SUM + "".join(f"x{i} = y{i} + {i}\n" for i in range(100_000))
    start = time.process_time()
    text, rows = _report(tmp_path, {"ann": huge, "bea": huge})
    seconds = time.process_time() - start
    assert seconds < 3.0, f"{seconds:.1f} CPU-s for two answers of {len(huge):,} characters"
    assert f"- ann: the answer to lab 97.2 is {len(huge) + 1:,} characters; only its first 50,000 were compared" in text
    assert ("identical_file", "ann", "bea") in [(r["kind"], r["student_a"], r["student_b"]) for r in rows]


def test_a_notebook_of_many_cells_costs_a_bounded_time(tmp_path):
    # 20,000 code cells (5.6 MB, written as JSON here): read in 0.14 CPU-s; nbformat.reads took 0.46, and cells made
    # by nbformat.v4.new_code_cell, which validates each, 3.0.
    lab.build(tmp_path)
    nb = json.loads((tmp_path / "labs" / "97_fixture.ipynb").read_text())
    nb["cells"] += [{"cell_type": "code", "id": f"c{i}", "metadata": {}, "outputs": [], "execution_count": None,
                     "source": "def add(a, b):\n    return a\n" + "x = 1\n" * 20} for i in range(20_000)]
    path = tmp_path / "submissions" / "many.ipynb"
    path.write_text(json.dumps(nb))
    released = nbformat.read(tmp_path / "labs" / "97_fixture.ipynb", as_version=4)
    start = time.process_time()
    found = similarity.read_class(released, {"many": path, "alice": lab.submission(tmp_path, "alice", None,
                                                                                   lab.GATHER_SUM)})
    seconds = time.process_time() - start
    assert seconds < 2.0, f"{seconds:.1f} CPU-s"
    assert [a.student for a in found.answers["97.2"]] == ["alice", "many"] and not found.unread


def test_an_answer_built_against_the_starter_costs_a_bounded_time(tmp_path):
    # Issue 29: one answer per question of lab 12, each 50,000 characters of `x` lines (the cap's worth of one
    # token, `V ;`, the released cells' most common one): finding the starter's runs in it by difflib's alignment
    # cost each question ~2 CPU-s (count in the starter x answer tokens, recursively); a class of 2 waited for it.
    released = nbformat.read(next(ROOT.glob("labs/12_*.ipynb")), as_version=4)
    hostile = copy.deepcopy(released)
    for cell in hostile.cells:
        if cell.get("metadata", {}).get("dp_course", {}).get("answers"):
            cell.source = "x\n" * 25_000
    paths = {}
    for student, nb in (("hostile", hostile), ("honest", released)):
        paths[student] = tmp_path / f"{student}.ipynb"
        nbformat.write(nb, paths[student])
    start = time.process_time()
    similarity_report.write(tmp_path, "12", released, paths)
    seconds = time.process_time() - start
    assert seconds < 1.5, f"{seconds:.1f} CPU-s for a class of 2"
