"""A check's or probe's run whose only reachable student code is labgen's stubs starts no ranks (shared_run.only_todos).

Its verdict, "not implemented", is the one the ranks would give (tests/test_labs.py runs every lab's student version
through it); anything else of the student's within reach must launch, since a check may pass or fail without
reaching a raise that sits behind given code, in a branch, or in a class.
"""
import functools
import types

import pytest

from helpers.errors import RankFailed
from helpers.grading.shared_run import launch_gloo, only_todos, todo_stub

NOTEBOOK = '''
import torch

def stub(t):
    """The docstring stays."""
    # TODO(lab 2.2): the comment stays too
    raise NotImplementedError("lab 2.2")

def other_stub():
    raise NotImplementedError("lab 2.3")

def given_code_first(t):
    n = t.numel()
    raise NotImplementedError("lab 2.4")

def in_a_branch(t):
    if t is None:
        return 0
    raise NotImplementedError("lab 2.4")

def written(t):
    return t * 2

def not_the_lab_text():
    raise NotImplementedError

def generator():
    raise NotImplementedError("lab 2.2")
    yield

class Answer:
    def step(self):
        raise NotImplementedError("lab 2.5")

def _probe_uses_stub(n):
    return stub(torch.ones(n))

def _probe_uses_both(n):
    return written(stub(torch.ones(n)))

a_lambda = lambda t: stub(t)  # noqa: E731

def _probe_calls_helper(n):
    return _probe_uses_stub(n)
'''


def notebook(source=NOTEBOOK):
    """The namespace of a notebook that ran source (its functions' module is __main__, as in a kernel)."""
    ns = {"__name__": "__main__"}
    exec(source, ns)  # noqa: S102 - test code
    return ns


def on_ranks(fn, t):
    """Instructor code, as a check's rank function: it is handed the student's answer."""
    return fn(t)


on_ranks.__module__ = "helpers.grading.checks.labXX"  # the course's code; a test module's is anyone's (below)


def from_elsewhere(t):
    """A function of no notebook and not of the course: a student's own module, a library."""
    return t


def test_only_the_generated_stub_counts():
    ns = notebook()
    assert todo_stub(ns["stub"]) == "lab 2.2"
    assert todo_stub(ns["other_stub"]) == "lab 2.3"
    for name in ("given_code_first", "in_a_branch", "written", "not_the_lab_text", "generator", "Answer"):
        assert todo_stub(ns[name]) is None, name
    assert todo_stub(ns["Answer"].step) is None  # a method: its class may be used without it
    shadowed = notebook(NOTEBOOK + "\nclass NotImplementedError(Exception):\n    pass\n")
    assert todo_stub(shadowed["stub"]) is None  # the raise is no longer the builtin NotImplementedError


def test_a_run_that_reaches_only_stubs_is_not_implemented_without_ranks():
    ns = notebook()
    for fn, args in [(on_ranks, (ns["stub"], 1)), (on_ranks, ([{"fn": ns["stub"]}],)),
                     (ns["_probe_uses_stub"], (3,)), (ns["_probe_calls_helper"], (3,)),
                     (on_ranks, ((ns["stub"], ns["other_stub"]),))]:
        failure = only_todos(fn, args)
        assert isinstance(failure, RankFailed), (fn, args)
        assert failure.exc_type == "NotImplementedError" and failure.exitcode is None and failure.rank == 0
    closure = (lambda answer: (lambda: on_ranks(answer, 1)))(ns["stub"])
    closure.__module__ = "helpers.grading.checks.labXX"  # a nested rank function of a check module
    assert only_todos(closure, ()) is not None
    with pytest.raises(RankFailed, match="lab 2.2"):  # the launcher's own error, before any rank starts
        launch_gloo(on_ranks, 2, args=(ns["stub"], 1))


def test_a_run_that_may_reach_other_student_code_launches():
    ns = notebook()
    for args in [(ns["stub"], ns["written"]), (ns["given_code_first"],), (ns["in_a_branch"],), (ns["Answer"],),
                 (ns["Answer"](),), (ns["a_lambda"],), (functools.partial(ns["stub"]),), (), (1, "x")]:
        assert only_todos(on_ranks, args) is None, args
    assert only_todos(ns["_probe_uses_both"], (3,)) is None
    assert only_todos(ns["written"], ()) is None
    # Code from outside the notebook and the course, or objects that may hold the student's: launched too.
    import torch

    for other in [from_elsewhere, torch.nn.Linear(2, 2), map(ns["written"], []), ns["Answer"]().step,
                  [].append, object(), types.ModuleType("my_answers")]:
        assert only_todos(on_ranks, (ns["stub"], other)) is None, other
    assert only_todos(on_ranks, (ns["stub"], torch.ones(2), torch.float32, 3, "x", None, len)) is not None


PROBE_CLASS = '''
class _probe_Net:
    def __init__(self):
        self.width = 3

    @property
    def answer(self):
        return {answer}(self.width)

def _probe_with_class():
    return _probe_Net().answer
'''


@pytest.mark.parametrize("answer, todo", [("stub", True), ("written", False)])
def test_a_probe_class_is_read_like_the_probe_helpers(answer, todo):
    ns = notebook(NOTEBOOK + PROBE_CLASS.format(answer=answer))
    assert (only_todos(ns["_probe_with_class"], ()) is not None) == todo
