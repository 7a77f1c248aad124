"""Lab 06's public checks: the solution passes every one; realistic wrong answers fail, saying why."""
import itertools
import sys

import cloudpickle
import pytest
import torch

from helpers.grading import check
from helpers.grading.checks.lab06.q3_activation_bytes import (
    Block,
    measured_activation_bytes,
    reference_activation_bytes,
    saved_activation_bytes,
)
from helpers.grading.prepare.labgen import ROOT
from helpers.grading.probes import load
from tests import lab_solution

cloudpickle.register_pickle_by_value(sys.modules[__name__])  # ranks must not import this test module

SOLUTION = ROOT / "solutions" / "06_memory_anatomy.ipynb"
ANSWER_CELLS = ("imports", "q61", "q62", "q63-block", "q63", "q64")


def solution_namespace(override=""):
    """The solution's imports and answers exec'd into a fresh namespace; `override` then redefines some of them."""
    return lab_solution.namespace(SOLUTION, lambda cell: cell.id in ANSWER_CELLS, override)


def assert_fails(question, override, expected):
    lab_solution.assert_fails(check(question, solution_namespace(override)), expected)


@pytest.mark.parametrize("question, total", [("6.1", 4), ("6.2", 3), ("6.3", 3)])
def test_solution_passes(question, total):
    result = check(question, solution_namespace())
    assert result.total == total and result.passed == total, result.lines


def test_reference_formula_is_what_autograd_saves():
    """The 6.3 reference (used for the GPT-3-sized check) equals the measured count on a grid of shapes."""
    for b, t, (d, h), act in itertools.product((1, 3), (1, 5), ((8, 1), (12, 3)), ("gelu", "relu")):
        f, layers = 20, 2
        assert reference_activation_bytes(b, t, d, h, f, layers, act) == \
            measured_activation_bytes(b, t, d, h, f, layers, act), (b, t, d, h, f, layers, act)


def test_lab_block_is_the_checks_block():
    """The Block and the instrument the lab shows count exactly what the checks count."""
    ns = solution_namespace()
    torch.manual_seed(0)
    x = torch.randn(2, 6, 12)
    for activation in ("gelu", "relu"):
        torch.manual_seed(1)
        lab = ns["saved_activation_bytes"](ns["Block"](12, 3, 20, activation), x)[0]
        assert lab == saved_activation_bytes(Block(12, 3, 20, activation), x)[0]


STAGES = '''
def model_state_bytes(num_params, world_size, stage, *, param_bytes=2, grad_bytes=2, optimizer_bytes=12):
    if stage not in (0, 1, 2, 3) or world_size < 1:
        raise ValueError(stage)
    p = {P} * num_params / (world_size if stage {PS} else 1)
    g = {G} * num_params / (world_size if stage {GS} else 1)
    o = {O} * num_params / (world_size if stage {OS} else 1)
    return {{"params": p, "grads": g, "optimizer": o, "total": p + g + o}}
'''
RIGHT = dict(P="param_bytes", G="grad_bytes", O="optimizer_bytes", PS=">= 3", GS=">= 2", OS=">= 1")

WRONG = {
    "6.1 ZeRO-2 drops the gradients (the 210 GB table)": (
        "6.1", STAGES.format(**{**RIGHT, "G": "(0 if stage == 2 else grad_bytes)"}),
        {"figure_1_of_the_zero_paper": "it never drops them: a ZeRO-2 total without the gradients"}),
    "6.1 hard-coded 2 + 2 + 12": ("6.1", STAGES.format(**{**RIGHT, "P": "2", "G": "2", "O": "12"}), {
        "every_stage_and_convention": "it is the default 2 + 2 + 12 answer: use param_bytes"}),
    "6.1 each stage shards only its own category": (
        "6.1", STAGES.format(**{**RIGHT, "PS": "== 3", "GS": "== 2", "OS": "== 1"}),
        {"figure_1_of_the_zero_paper": "stage 2 shards the optimizer: each device holds bytes / world_size"}),
    "6.2 ignores reserved_bytes": ("6.2", '''
        def largest_model(memory_bytes, world_size, stage, *, reserved_bytes=0, param_bytes=2, grad_bytes=2,
                          optimizer_bytes=12):
            per = model_state_bytes(1, world_size, stage, param_bytes=param_bytes, grad_bytes=grad_bytes,
                                    optimizer_bytes=optimizer_bytes)["total"]
            return int(memory_bytes // per)
        ''', {"reserved_bytes_are_kept_free": "the reserved bytes are not available for model states"}),
    "6.3 no attention probabilities": ("6.3", '''
        def activation_bytes(batch, seq_len, d_model, n_heads, d_ff, *, n_layers=1, activation="gelu"):
            b, t, d, f = batch, seq_len, d_model, d_ff
            return 4 * n_layers * (8 * b * t * d + 4 * b * t + (2 if activation == "gelu" else 1) * b * t * f)
        ''', {"one_block_matches_saved_tensors": "missing: the attention probabilities softmax saves"}),
    "6.3 ReLU's output counted twice": ("6.3", '''
        def activation_bytes(batch, seq_len, d_model, n_heads, d_ff, *, n_layers=1, activation="gelu"):
            b, t, d, h, f = batch, seq_len, d_model, n_heads, d_ff
            return 4 * n_layers * (8 * b * t * d + 4 * b * t + 2 * b * t * f + b * h * t * t)
        ''', {"relu_and_stacked_layers": "counted once too often: one (B, T, F) tensor of the MLP"}),
    "6.3 builds and measures the model": ("6.3", '''
        def activation_bytes(batch, seq_len, d_model, n_heads, d_ff, *, n_layers=1, activation="gelu"):
            model = nn.Sequential(*[Block(d_model, n_heads, d_ff, activation) for _ in range(n_layers)])
            return saved_activation_bytes(model, torch.randn(batch, seq_len, d_model))[0]
        ''', {"gpt3_sized_block_is_arithmetic": "do not build or measure the model"}),
}


@pytest.mark.parametrize("name", WRONG)
def test_wrong_answers_fail(name):
    question, override, expected = WRONG[name]
    assert_fails(question, override, expected)


@pytest.mark.timeout(120)
def test_solution_passes_6_4():
    result = check("6.4", solution_namespace())
    assert result.total == 4 and result.passed == 4, result.lines


WRONG_6_4 = {
    "no DDP: each rank trains alone": ('''
        def train_replica(model, X, Y, *, steps, lr):
            optimizer = torch.optim.Adam(model.parameters(), lr=lr)
            for _ in range(steps):
                optimizer.zero_grad()
                F.mse_loss(model(X), Y).backward()
                optimizer.step()
            return state_bytes(model, optimizer)
        ''', {"identical_on_every_rank_despite_different_data": "wrap the model in DistributedDataParallel"}),
    "zero_grad after the step: no gradients held": ('''
        def train_replica(model, X, Y, *, steps, lr):
            ddp = DDP(model)
            optimizer = torch.optim.Adam(ddp.parameters(), lr=lr)
            for _ in range(steps):
                F.mse_loss(ddp(X), Y).backward()
                optimizer.step()
                optimizer.zero_grad()
            return state_bytes(model, optimizer)
        ''', {"model_states_are_4_4_8_bytes_per_parameter": "no gradients held at the end",
              "model_states_match_your_model_state_bytes": "state_bytes reports grads = 0"}),
}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("name", WRONG_6_4)
def test_wrong_replicas_fail(name):
    override, expected = WRONG_6_4[name]
    assert_fails("6.4", override, expected)


def test_probes_run_on_the_solution():
    """Every single-process probe evaluates on the solution to plain, deterministic data."""
    from helpers.grading.judge.plain import to_plain

    setup, probes = load("06")
    ns = solution_namespace()
    ns["_PROBE_SEED"] = 12345  # the grader's run_probes sets it: the question's secret seed
    exec(setup, ns)
    for probe in probes:
        if probe.question != "6.4":
            first, second = (to_plain(eval(probe.expr, ns)) for _ in range(2))
            assert first == second, probe.name


def test_todo_reports_not_implemented_without_starting_ranks():
    ns = solution_namespace('''
        def train_replica(model, X, Y, *, steps, lr):
            raise NotImplementedError("lab 6.4")
        ''')
    result = check("6.4", ns)
    assert result.not_implemented == result.total == 4, result.lines
