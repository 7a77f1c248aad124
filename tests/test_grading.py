"""The lab format: markers -> student code, check() reporting, never raising."""
import nbformat
import pytest

from helpers.grading import check
from helpers.grading.check import MIMETYPE, run_one
from helpers.grading.prepare.labgen import ROOT, MarkerError, student_notebook, student_source
from helpers.grading.registry import _CHECKS, answer, public_check, questions_of

SOLUTION = '''def mean_grad(grads):
    """Mean of a list of tensors."""
    ### BEGIN SOLUTION (lab 9.1) average the gradients
    total = sum(grads)
    return total / len(grads)
    ### END SOLUTION

x = 1
'''


def test_student_source_replaces_region_at_its_indentation():
    source, questions = student_source(SOLUTION)
    assert questions == ["9.1"]
    assert '    # TODO(lab 9.1): average the gradients\n    raise NotImplementedError("lab 9.1")' in source
    assert "total" not in source and "SOLUTION" not in source
    assert source.endswith("x = 1")


@pytest.mark.parametrize("bad, match", [
    ("### END SOLUTION\n", "line 1: END SOLUTION without a BEGIN"),
    ("### BEGIN SOLUTION (lab 1.1)\nx = 1\n", "lab 1.1 is never closed"),
    ("### BEGIN SOLUTION (lab 1.1)\n### BEGIN SOLUTION (lab 1.2)\n",
     "line 2: BEGIN SOLUTION inside the region of lab 1.1"),
])
def test_malformed_markers_are_reported(bad, match):
    with pytest.raises(MarkerError, match=match):
        student_source(bad)


def test_student_notebook_is_clean_and_keeps_ids():
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_markdown_cell("# Lab"), nbformat.v4.new_code_cell(SOLUTION)]
    nb.cells[1].outputs = [nbformat.v4.new_output("stream", text="hi")]
    nb.cells[1].execution_count = 3
    lab = student_notebook(nb)
    assert lab.cells[1].outputs == [] and lab.cells[1].execution_count is None
    assert lab.cells[1].id == nb.cells[1].id
    assert lab.cells[1].metadata["dp_course"] == {"answers": ["9.1"]}
    assert nb.cells[1].outputs, "the solution itself must not be modified"


@pytest.fixture
def fake_question():
    @public_check("99.1")
    def returns_two(ns):
        assert answer(ns, "two")() == 2, "two() should return 2"

    @public_check("99.1")
    def crashes_politely(ns):
        answer(ns, "two")()
        raise KeyError("boom")

    yield "99.1"
    _CHECKS.pop("99.1")


def test_check_counts_passed_failed_not_implemented(fake_question, capsys, monkeypatch):
    monkeypatch.setattr("helpers.grading.registry.importlib.import_module", lambda name: None)
    result = check(fake_question, {"two": lambda: 2})
    assert (result.passed, result.total, result.not_implemented) == (1, 2, 0)
    out = capsys.readouterr().out
    assert "[PASS] 99.1 returns_two" in out and "[FAIL] 99.1 crashes_politely: KeyError: 'boom'" in out
    assert "graded (hidden) tests are run separately" in out

    def todo():
        raise NotImplementedError("lab 99.1")

    result = check(fake_question, {"two": todo})
    assert (result.passed, result.not_implemented) == (0, 2)
    result = check(fake_question, {})
    assert result.passed == 0 and "`two` is not defined" in result.lines[0]


def test_check_never_raises_on_unknown_question(capsys):
    result = check("42.1", {})
    assert result.total == 0 and "no checks for lab 42" in capsys.readouterr().out
    result = check("banana", {})
    assert result.total == 0


def test_result_carries_machine_readable_json(fake_question, monkeypatch):
    monkeypatch.setattr("helpers.grading.registry.importlib.import_module", lambda name: None)
    bundle = check(fake_question, {"two": lambda: 2})._repr_mimebundle_()
    assert bundle[MIMETYPE]["passed"] == 1 and bundle[MIMETYPE]["total"] == 2


def test_rank_not_implemented_counts_as_not_implemented():
    from helpers.errors import RankFailed

    def on_ranks(ns):
        raise RankFailed("rank 0 raised NotImplementedError: lab 3.1", rank=0, exc_type="NotImplementedError")

    assert run_one(on_ranks, {}) == ("not implemented", "not implemented yet")


def test_shared_run_computes_once_per_key_and_replays_failures():
    from helpers.grading.shared_run import SharedRun
    shared, calls = SharedRun(), []

    def compute(value):
        calls.append(value)
        if value == "bad":
            raise RuntimeError("rank 1 failed")
        return value

    assert shared("1.1", "a", lambda: compute("a")) == shared("1.1", "a", lambda: compute("a")) == "a"
    for _ in range(2):
        with pytest.raises(RuntimeError, match="rank 1 failed"):
            shared("1.1", "b", lambda: compute("bad"))
    assert shared("1.1", "a", lambda: compute("a")) == "a"  # only the latest key is kept: computed again
    assert calls == ["a", "bad", "a"]


@pytest.mark.parametrize("solution", sorted((ROOT / "solutions").glob("*.ipynb")), ids=lambda p: p.name[:2])
def test_every_question_with_public_checks_has_a_check_cell_in_its_solution(solution):
    cells = [c.source for c in nbformat.read(solution, as_version=4).cells if c.cell_type == "code"]
    questions = questions_of(int(solution.name[:2]))
    assert questions, f"{solution.name}: no public checks registered"
    assert [q for q in questions if f'check("{q}", globals())' not in cells] == [], solution.name
