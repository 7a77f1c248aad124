"""Lab 10's public checks: the solution passes every one; realistic wrong answers fail, saying why."""
import sys

import cloudpickle
import pytest

from helpers.grading import check
from helpers.grading.labgen import ROOT
from helpers.grading.probes import load
from tests import lab_solution

cloudpickle.register_pickle_by_value(sys.modules[__name__])  # ranks must not import this test module
SOLUTION = ROOT / "solutions" / "10_capstone_gpt.ipynb"


def solution_namespace(override=""):
    """The solution's imports and answers exec'd into a fresh namespace; `override` then redefines some of them."""
    return lab_solution.namespace(SOLUTION, lambda cell: cell.id == "imports" or lab_solution.is_answer(cell), override)


def assert_fails(question, override, expected):
    lab_solution.assert_fails(check(question, solution_namespace(override)), expected)


def test_solution_passes_10_1():
    result = check("10.1", solution_namespace())
    assert result.total == 5 and result.passed == result.total, result.lines


@pytest.mark.timeout(120)
@pytest.mark.parametrize("question", ["10.2", "10.3"])
def test_solution_passes_multi_rank(question):
    result = check(question, solution_namespace())
    assert result.total == 4 and result.passed == result.total, result.lines


BATCH = "def get_batch(data, rank, world_size, step, batch_size, block_size, seed):\n"
ROWS = '''
    rows = torch.stack([data[o:o + block_size + 1] for o in mine.tolist()]).long()
    return rows[:, :-1], rows[:, 1:]
'''

WRONG_10_1 = {
    "every rank reads the same rows": (BATCH + '''
    g = torch.Generator().manual_seed(seed * 1_000_003 + step)
    mine = torch.randperm(len(data) - block_size, generator=g)[:batch_size]
''' + ROWS, {"ranks_together_make_the_global_batch": "the ranks' rows, one after the other",
             "different_for_every_rank_step_and_seed": "got the same batch at step 0: use the rank"}),
    "each rank seeds its own generator": (BATCH + '''
    g = torch.Generator().manual_seed(seed * 1_000_003 + step + 7919 * rank)
    mine = torch.randperm(len(data) - block_size, generator=g)[:batch_size]
''' + ROWS, {"ranks_together_make_the_global_batch": "seeded with seed and step only (not the rank)"}),
    "chapter 10's version: with replacement": (BATCH + '''
    g = torch.Generator().manual_seed(seed * 1_000_003 + step)
    mine = torch.randint(len(data) - block_size, (world_size * batch_size,), generator=g)[rank * batch_size:(rank + 1) * batch_size]
''' + ROWS, {"no_window_twice_in_a_step": "without replacement (torch.randperm)"}),
    "global torch.manual_seed, target not shifted": (BATCH + '''
    torch.manual_seed(seed * 1_000_003 + step)
    mine = torch.randperm(len(data) - block_size)[rank * batch_size:(rank + 1) * batch_size]
    x = torch.stack([data[o:o + block_size] for o in mine.tolist()]).long()
    return x, x.clone()
''', {"windows_with_next_character_targets": "y must be x shifted by one token",
      "deterministic_and_leaves_the_global_generator_alone": "changed torch's global random state"}),
}


@pytest.mark.parametrize("name", WRONG_10_1)
def test_wrong_get_batch_fails(name):
    override, expected = WRONG_10_1[name]
    assert_fails("10.1", override, expected)


STEP = "def train_step(model, x, y, optimizer, grad_clip):\n"

WRONG_MULTI_RANK = {
    "10.2 clip before averaging": ("10.2", STEP + '''
    _, loss = model(x, y)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)   # this rank's own norm
    for p in model.parameters():
        dist.all_reduce(p.grad)
        p.grad /= dist.get_world_size()
    optimizer.step()
    total = loss.detach().clone()
    dist.all_reduce(total)
    return total.item() / dist.get_world_size()
''', {"clipped_after_averaging": "Clip AFTER averaging",
      "identical_on_every_rank_and_equal_to_one_process": "differ from one process on the global batch"}),
    "10.2 no averaging, own loss": ("10.2", STEP + '''
    _, loss = model(x, y)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    optimizer.step()
    return loss.item()
''', {"gradients_are_the_mean_over_ranks": "still this rank's own gradient",
      "identical_on_every_rank_and_equal_to_one_process": "rank 1's parameters differ from rank 0's",
      "returns_the_global_batch_loss": "returned its own batch's loss"}),
    "10.3 no broadcast: the replicas never meet": ("10.3", '''
def train_gpt(data, *, steps, batch_size, block_size, lr, grad_clip, seed, model_config):
    rank, world_size = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(seed + rank)
    model = GPT(model_config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.1)
    losses = [train_step(model, *get_batch(data, rank, world_size, step, batch_size, block_size, seed), optimizer,
                         grad_clip) for step in range(steps)]
    return {"losses": losses, "params": torch.cat([p.detach().reshape(-1) for p in model.parameters()])}
''', {"different_data_identical_parameters": "rank 1's parameters differ from rank 0's",
      "equals_torch_ddp": "differ from torch DDP's"}),
}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("name", WRONG_MULTI_RANK)
def test_wrong_multi_rank_answers_fail(name):
    question, override, expected = WRONG_MULTI_RANK[name]
    assert_fails(question, override, expected)


@pytest.mark.timeout(120)
def test_todo_reports_not_implemented():
    ns = solution_namespace(STEP + '    raise NotImplementedError("lab 10.2")\n')
    for question in ("10.2", "10.3"):       # 10.3's train_gpt runs, and meets the TODO on the ranks
        result = check(question, ns)
        assert result.not_implemented == result.total == 4, result.lines


def test_single_process_probes_are_deterministic_on_the_solution():
    from helpers.grading.plain import to_plain

    setup, probes = load("10")
    ns = solution_namespace()
    ns["_PROBE_SEED"] = 12345  # the grader's run_probes sets it: the question's secret seed
    exec(setup, ns)
    for probe in probes:
        if probe.question == "10.1":
            first, second = (to_plain(eval(probe.expr, ns)) for _ in range(2))
            assert first == second, probe.name
            # The judge, in the grader's process, accepts the solution's raw batches.
            assert probe.grade(first, first, seed=12345) == (True, ""), probe.name
