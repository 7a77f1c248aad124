"""Lab 10's public checks: there are as many as the lab says; the student version reports "not implemented"; the GPT's
adaptations for FlatShard (the tied head, the tuple output) hold; the hidden tests are stable on the solution.

Wrong answers, each with the first line it must get, are in the mistake catalogue (tests/mistakes/lab10.py).

The solution passes every check: tests/test_labs.py runs the solution notebook and asserts each check() result
(this file ran the same checks on the solution's definitions to assert the same).
"""
import sys

import cloudpickle
import pytest

from helpers.grading import check
from helpers.grading.prepare.labgen import ROOT
from helpers.grading.registry import checks_for
from tests import lab_solution

cloudpickle.register_pickle_by_value(sys.modules[__name__])  # ranks must not import this test module
SOLUTION = ROOT / "solutions" / "10_capstone_gpt.ipynb"
if str(ROOT / "chapters") not in sys.path:
    sys.path.insert(0, str(ROOT / "chapters"))
QUESTIONS = {"10.1": 3, "10.2": 4, "10.3": 4, "10.5": 5}


def solution_namespace(override=""):
    """The solution's parameters, imports and definitions (no launches), then `override`."""
    return lab_solution.definitions(SOLUTION, override)


@pytest.mark.parametrize("question", QUESTIONS)
def test_every_question_has_its_number_of_checks(question):
    assert len(checks_for(question)) == QUESTIONS[question]


def test_todo_reports_not_implemented_without_starting_ranks():
    todo = "".join(f'\ndef {name}():\n    raise NotImplementedError("lab {q}")\n'
                   for name, q in (("bring_reducer", "10.1"), ("bring_zero2", "10.2"), ("bring_flat_shard", "10.3"),
                                   ("register_hooks_with_prefetch", "10.5")))
    ns = solution_namespace(todo)
    for question, total in QUESTIONS.items():
        result = check(question, ns)
        assert result.not_implemented == result.total == total, result.lines


def _tied_head_reads_the_gathered_embedding(FlatShard):
    """On every rank: the GPT wrapped as FlatShardRun wraps it; the head's weight is the embedding's view, and both
    are gone between forwards (no stale full tensor)."""
    import torch
    from capstone import yours

    cfg = yours.CapstoneConfig(n_layer=1, n_embd=8, block_size=4)
    run = yours.make_run("flatshard", yours.make_gpt(cfg, 11), cfg, FlatShard)
    gpt, seen = run.model, []
    gpt.lm_head.register_forward_pre_hook(lambda head, args: seen.append(head.weight is gpt.wte.weight))
    x = torch.randint(11, (2, 4))
    loss = run.step(x, x)
    return {"same_tensor": seen, "head_after": hasattr(gpt.lm_head, "weight"), "wte_after": hasattr(gpt.wte, "weight"),
            "params": [n for n, _ in gpt.named_parameters()], "loss": float(loss)}


@pytest.mark.timeout(120)
def test_flat_shard_units_of_the_gpt_share_the_tied_weight():
    from helpers.grading.shared_run import launch_gloo

    FlatShard = solution_namespace()["bring_flat_shard"]()
    for out in launch_gloo(_tied_head_reads_the_gathered_embedding, 2, args=(FlatShard,), hang_timeout=60):
        assert out["same_tensor"] == [True] and not out["head_after"] and not out["wte_after"], out
        assert out["params"] == ["flat_shard", "h.0.flat_shard"], out["params"]   # the root's, then the block's


def test_an_unknown_run_or_a_missing_component_says_what_to_pass():
    from capstone import yours

    with pytest.raises(ValueError, match="kind='ddp2': no such run; pass one of"):
        yours.make_run("ddp2", None, yours.CapstoneConfig())
    with pytest.raises(ValueError, match="kind='zero2' trains with YOUR component: pass component="):
        yours.make_run("zero2", None, yours.CapstoneConfig())
