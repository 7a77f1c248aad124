"""Lab 12's public checks: there are as many as the lab says, a check() cell for every question, and the torch
behaviour the lab's text and checks rely on (torch 2.13, read in its installed source and run).

The solution passes every check: tests/test_labs.py runs the solution notebook and asserts each check() result.
The wrong answers, with the first line each must get, are the catalogue tests/mistakes/lab12.py, run by
tests/test_mistakes.py.
"""
import inspect

import pytest
import torch

from helpers.grading.checks.lab12 import common
from helpers.grading.checks.lab12 import q1_loss_scaler as q1
from helpers.grading.checks.lab12 import q3_autocast_bytes as q3
from helpers.grading.prepare.labgen import ROOT
from helpers.grading.registry import checks_for
from tests import lab_solution

SOLUTION = ROOT / "solutions" / "12_mixed_precision.ipynb"
TOTALS = {"12.1": 5, "12.2": 4, "12.3": 4, "12.4": 4}


@pytest.mark.parametrize("question", sorted(TOTALS))
def test_every_question_has_its_number_of_checks(question):
    assert len(checks_for(question)) == TOTALS[question]


def test_gradscaler_runs_on_the_cpu_and_sharded_grad_scaler_all_reduces_found_inf():
    """The lab says GradScaler lists 'cpu' and has CPU kernels (12.1 runs it), and ShardedGradScaler.unscale_
    all-reduces found_inf (12.2's reference): an upgrade that changes either fails here first."""
    from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

    assert "'cpu'" in inspect.getdoc(torch.amp.GradScaler.__init__) or "'cpu'" in inspect.getdoc(torch.amp.GradScaler)
    assert "dist.all_reduce(found_inf" in inspect.getsource(ShardedGradScaler.unscale_)
    p = torch.nn.Parameter(torch.ones(2))
    scaler = torch.amp.GradScaler("cpu", init_scale=4.0, growth_interval=1)
    p.grad = scaler.scale(torch.tensor([1.0, float("inf")]))
    scaler.step(torch.optim.SGD([p], lr=0.1))
    scaler.update()
    assert scaler.get_scale() == 2.0 and torch.equal(p.detach(), torch.ones(2))


def test_the_stream_shows_every_wrong_schedule():
    """At every OFFSET a hidden test may use, the stream's GradScaler schedule differs from each wrong one the check
    names, so the check can tell them apart (a NaN after a clean step: a counter not reset shows)."""
    ns = lab_solution.definitions(SOLUTION)
    try:
        for offset in range(0, 30, 7):
            common.OFFSET = offset
            theirs = q1.runs(ns["LossScaler"])["torch"]["stream"]
            init_scale, interval, _ = q1.settings()
            assert q1._schedule(theirs["skipped"], init_scale, interval) == theirs["used"]
            for variant in q1.WRONG_SCHEDULES:
                assert q1._schedule(theirs["skipped"], init_scale, interval, variant) != theirs["used"], (offset,
                                                                                                        variant)
    finally:
        common.OFFSET = 0


def test_the_byte_formulas_hold_at_other_sizes():
    """12.3's formulas, measured by the solution at sizes the hidden tests use."""
    fn = lab_solution.definitions(SOLUTION)["autocast_bytes"]
    try:
        for offset in (0, 4, 11, 37):
            common.OFFSET = offset
            assert q3.runs(fn) == q3.formulas(), offset
    finally:
        common.OFFSET = 0
