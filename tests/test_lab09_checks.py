"""Lab 09's public checks: realistic wrong answers fail, saying why.

The solution passes every check: tests/test_labs.py runs the solution notebook and asserts each check() result
(this file ran the same checks on the solution's definitions to assert the same).
"""
import sys

import cloudpickle
import nbformat
import pytest

from helpers.grading.checks.lab09.common import FP32_ADAM, make_net, num_params
from helpers.grading.checks.lab09.q1_choose_strategy import CHOOSE_CASES, cheapest_strategy_that_fits
from helpers.grading.checks.lab09.q2_apply_strategy import ddp_zero2_and_fsdp_on_a_1d_mesh
from helpers.grading.checks.lab09.q3_train_within_budget import fsdp_within_budget_on_3_ranks
from helpers.grading.checks.lab09.q4_choose_framework import (
    BRANCH_RULE,
    BRANCH_TOOL,
    RULES,
    SCENARIOS,
    Scenario,
    decide,
    every_rule_on_its_own_scenario,
    judge_answers,
    secret_scenarios,
)
from helpers.grading.prepare.labgen import ROOT
from helpers.grading.probes import lab09 as probes
from tests import lab_solution

cloudpickle.register_pickle_by_value(sys.modules[__name__])  # ranks must not import this test module

SOLUTION = ROOT / "solutions" / "09_pytorch_fsdp.ipynb"


def solution_namespace(override=""):
    """The solution's imports and answers exec'd into a fresh namespace; `override` then redefines some of them."""
    return lab_solution.namespace(
        SOLUTION, lambda cell: cell.id in ("lab09-params", "lab09-imports", "lab09-q4-scenario")
        or lab_solution.is_answer(cell), override)


def fails_with(check_fn, ns, fragment):
    """check_fn(ns) must raise an AssertionError whose message contains `fragment`."""
    with pytest.raises(AssertionError) as info:
        check_fn(ns)
    assert fragment in str(info.value), str(info.value)


def test_recorded_choices_are_the_solutions():
    """The choices the 9.1 and 9.3 checks hold as data are what the solution's choose_strategy returns today."""
    choose = solution_namespace()["choose_strategy"]
    assert [choose(*args, **kwargs) for _, args, kwargs, *_ in CHOOSE_CASES] == [c[3] for c in CHOOSE_CASES]
    psi = num_params(make_net())
    assert [choose(psi, 3, int(7.5 * psi), **FP32_ADAM), choose(psi, 3, int(7.5 * psi))] == ["full_shard",
                                                                                            "shard_grad_op"]
    assert [choose(psi, 2, 12 * psi, **FP32_ADAM), choose(psi, 2, 12 * psi)] == ["shard_grad_op"] * 2


# --- 9.1 -------------------------------------------------------------------------------------------

LEAST_MEMORY = '''
def choose_strategy(num_params, world_size, memory_budget_bytes, *, group_size=None, k=12, param_bytes=2,
                    grad_bytes=2):
    fits = []
    for s in STRATEGY_ORDER:
        if s == "hybrid_shard" and group_size is None:
            continue
        g = group_size if s == "hybrid_shard" else None
        m = theory.strategy_memory(num_params, world_size, s, k, param_bytes=param_bytes, grad_bytes=grad_bytes,
                                   group_size=g)["total"]
        if m <= memory_budget_bytes:
            fits.append((m, s))
    return min(fits)[1] if fits else None
'''

# The solution with one change: `old` replaced by `new` in its 9.1 answer.
def choose_with(old, new):
    cell = next(c for c in nbformat.read(SOLUTION, as_version=4).cells if c.id == "lab09-q1")
    assert old in cell.source
    return cell.source.replace(old, new)


@pytest.mark.parametrize("override, fragment", [
    (LEAST_MEMORY, "the strategy with the least memory"),
    (choose_with('group_size=group, kind="wire")', "group_size=group)"), "the fewest LOGICAL bytes"),
    (choose_with("if memory > memory_budget_bytes:", "if memory >= memory_budget_bytes:"), "strictly larger"),
    (choose_with("group_size=group)[\"total\"]", "group_size=group and world_size)[\"total\"]"),
     "hybrid_shard's memory over all ranks"),
], ids=["least memory", "logical bytes", "strict <", "hybrid memory over all ranks"])
def test_wrong_choices_fail(override, fragment):
    fails_with(cheapest_strategy_that_fits, solution_namespace(override), fragment)


# --- 9.2 and 9.3 (one launch each) -----------------------------------------------------------------

ROOT_LEFT_TO_DEFAULT = '''
_solution_apply = apply_strategy
def apply_strategy(model, mesh, strategy, block_types):
    if strategy != "full_shard":
        return _solution_apply(model, mesh, strategy, block_types)
    for module in reversed(list(model.modules())):
        if isinstance(module, tuple(block_types)) and module is not model:
            fully_shard(module, mesh=mesh, reshard_after_forward=True)
    return fully_shard(model, mesh=mesh)              # None: the root stays gathered after forward
'''

MIXED_PRECISION_BYTES = '''
_solution_choose = choose_strategy
def choose_strategy(num_params, world_size, memory_budget_bytes, **convention):
    return _solution_choose(num_params, world_size, memory_budget_bytes)   # ignores the fp32 Adam bytes
'''


@pytest.mark.timeout(120)
def test_root_left_to_the_default_fails():
    fails_with(ddp_zero2_and_fsdp_on_a_1d_mesh, solution_namespace(ROOT_LEFT_TO_DEFAULT),
               "the root was not resharded after forward")


@pytest.mark.timeout(120)
def test_the_wrong_byte_convention_fails():
    fails_with(fsdp_within_budget_on_3_ranks, solution_namespace(MIXED_PRECISION_BYTES),
               "expected strategy 'full_shard'")


# --- 9.4 -------------------------------------------------------------------------------------------

def test_the_labs_scenario_is_the_checks():
    """The lab's Scenario (the students') has the checks' fields and defaults, and its tool names are the checks'."""
    ns = solution_namespace()
    assert ns["Scenario"]._fields == Scenario._fields
    assert ns["Scenario"]._field_defaults == Scenario._field_defaults
    from helpers.grading.checks.lab09.q4_choose_framework import NATIVE, TOOLS
    assert ns["NATIVE_TOOL"] == NATIVE and ns["TOOLS"] == TOOLS


def test_every_branch_decides_as_named_and_the_solution_agrees():
    """Each public scenario lands on its branch's rule and tool; the solution answers every one as decide does."""
    choose = solution_namespace()["choose_framework"]
    assert {BRANCH_RULE.get(b, 1) for b, _, _ in SCENARIOS} == set(RULES)
    for branch, _, s in SCENARIOS:
        rule, expected = decide(s)
        assert (rule, expected["tool"]) == (BRANCH_RULE.get(branch, 1), BRANCH_TOOL[branch]), branch
        assert choose(s) == expected, branch


@pytest.mark.parametrize("seed", range(40))
def test_secret_scenarios_exercise_every_branch(seed):
    """The hidden test's scenarios: one per branch, each drawn (not the public one), deciding as the branch does; the
    solution passes the grader's judge on them, split where the probes split them."""
    drawn = secret_scenarios(seed)
    assert len(drawn) == len(SCENARIOS)
    for (label, s), (branch, _, public) in zip(drawn, SCENARIOS):
        assert s is not public and decide(s)[0] == BRANCH_RULE.get(branch, 1), (seed, branch)
        assert decide(s)[1]["tool"] == BRANCH_TOOL[branch], (seed, branch)
    assert sum(decide(s)[0] <= 4 for _, s in drawn) == probes.ON_GPUS
    choose = solution_namespace()["choose_framework"]
    judge_answers([choose(s) for _, s in drawn], seed)


@pytest.mark.parametrize("override, fragment", [
    ("def choose_framework(s):\n    return {'tool': 'ddp', 'memory_per_gpu': 0.0, 'bytes_per_step': 0.0}\n",
     "ddp is right (rule 1); its memory_per_gpu 0: use theory.strategy_memory"),
    ("def choose_framework(s):\n    return {'tool': None, 'memory_per_gpu': None, 'bytes_per_step': None}\n",
     "rule 1 (PyTorch keeps up) applies first"),
    ("def choose_framework(s):\n    return ('ddp', 1.0, 2.0)\n", "return a dict with exactly the keys"),
    ("_right = choose_framework\ndef choose_framework(s):\n    return {**_right(s), 'tool': 'fsdp'}\n",
     "rule 1 (PyTorch keeps up) takes the FASTEST strategy that fits"),
], ids=["always DDP", "always None", "a tuple", "always FSDP"])
def test_wrong_frameworks_fail(override, fragment):
    fails_with(every_rule_on_its_own_scenario, solution_namespace(override), fragment)
