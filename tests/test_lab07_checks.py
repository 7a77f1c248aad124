"""Lab 07's public checks: there are as many as the lab says; realistic wrong answers fail, saying why.

The solution passes every check: tests/test_labs.py runs the solution notebook and asserts each check() result
(this file ran the same checks on the solution's definitions to assert the same).
"""
import sys

import cloudpickle
import pytest
import torch

from helpers.grading import check
from helpers.grading.prepare.labgen import ROOT
from helpers.grading.registry import checks_for
from tests import lab_solution
from tests.lab_solution import assert_fails, failed

cloudpickle.register_pickle_by_value(sys.modules[__name__])  # ranks must not import this test module

SOLUTION = ROOT / "solutions" / "07_zero_1_and_2.ipynb"
TOTALS = {"7.1": 5, "7.2": 5, "7.3": 5, "7.4": 5, "7.5": 4}


def solution_namespace(override=""):
    """The solution's imports, given code and answers exec'd into a fresh namespace; `override` then redefines some."""
    def wanted(cell):
        return cell.id in ("imports", "given-state") or lab_solution.is_answer(cell)
    return lab_solution.namespace(SOLUTION, wanted, override)


@pytest.mark.parametrize("question", sorted(TOTALS))
def test_every_question_has_its_number_of_checks(question):
    assert len(checks_for(question)) == TOTALS[question]


def test_zero_adamw_without_a_process_group_says_what_to_do():
    zero_adamw = solution_namespace()["ZeroAdamW"]
    with pytest.raises(RuntimeError, match="there is none: create it on every rank, inside a function run by"):
        zero_adamw([torch.nn.Parameter(torch.zeros(2))])


def test_torch_keeps_a_string_state_key_and_reads_an_int_one_as_a_parameter():
    """Lab 7.5 keys each group's shard state "group i", because Optimizer.load_state_dict (torch/optim/optimizer.py)
    puts a key that is not a parameter's index back as it is, and turns an int key into the parameter of that index."""
    p = torch.nn.Parameter(torch.zeros(2))
    saved = torch.optim.SGD([p], lr=0.1)
    saved.state["group 0"], saved.state[0] = {"step": 4}, {"step": 3}
    loaded = torch.optim.SGD([p], lr=0.1)
    loaded.load_state_dict(saved.state_dict())
    assert dict(loaded.state) == {"group 0": {"step": 4}, p: {"step": 3}}


WRONG_7_1 = {
    "start not clipped": ('''
        def shard_range(numel, rank, world_size):
            if not 0 <= rank < world_size:
                raise ValueError(rank)
            size = math.ceil(numel / world_size)
            start = rank * size
            stop = min(start + size, numel)
            return start, stop, size - (stop - start)
        ''', {"ranks_with_only_padding": "shard_range(5, rank=3, world_size=4) returned (6, 5, 3); expected (5, 5, 2)",
              "shards_tile_the_flat_parameter": "numel=1, world_size=3: rank 2's shard"}),
    "floor split, the rest on the last rank (no padding)": ('''
        def shard_range(numel, rank, world_size):
            if not 0 <= rank < world_size:
                raise ValueError(rank)
            size = numel // world_size
            stop = numel if rank == world_size - 1 else (rank + 1) * size
            return rank * size, stop, 0
        ''', {"padding_goes_to_the_last_ranks": "shard_range(10, rank=0, world_size=3) returned (0, 3, 0); expected "
                                                "(0, 4, 0)",
              "shards_tile_the_flat_parameter": "every shard must have"}),
}


@pytest.mark.parametrize("name", WRONG_7_1)
def test_wrong_shard_range_fails(name):
    override, expected = WRONG_7_1[name]
    assert_fails(check("7.1", solution_namespace(override)), expected)


WRONG_MULTI_RANK = {
    "7.2 weight decay added to the gradient (Adam's L2, not AdamW)": ("7.2", '''
        _step = zero_adamw_step

        def zero_adamw_step(params, grad_shard, state, *, lr, weight_decay, betas=(0.9, 0.999), eps=1e-8):
            rank, world_size = dist.get_rank(), dist.get_world_size()
            flat = torch.cat([p.detach().reshape(-1) for p in params])
            start, stop, pad = shard_range(flat.numel(), rank, world_size)
            shard = torch.cat([flat[start:stop], flat.new_zeros(pad)])
            _step(params, grad_shard + weight_decay * shard, state, lr=lr, weight_decay=0.0, betas=betas, eps=eps)
        ''', {"parameters_equal_torch_adamw": "weight_decay=0.1: after step 1 rank 0's parameters differ from "
                                              "torch.optim.AdamW's"}),
    "7.2 a torch.optim.AdamW made in every call (the state starts from zero)": ("7.2", '''
        def zero_adamw_step(params, grad_shard, state, *, lr, weight_decay, betas=(0.9, 0.999), eps=1e-8):
            rank, world_size = dist.get_rank(), dist.get_world_size()
            flat = torch.cat([p.detach().reshape(-1) for p in params])
            start, stop, pad = shard_range(flat.numel(), rank, world_size)
            shard = nn.Parameter(torch.cat([flat[start:stop], flat.new_zeros(pad)]))
            shard.grad = grad_shard
            torch.optim.AdamW([shard], lr=lr, weight_decay=weight_decay, betas=betas, eps=eps).step()
            state["step"] += 1
            gathered = flat.new_empty(world_size * shard.numel())
            dist.all_gather_single(gathered, shard.detach())
            with torch.no_grad():
                offset = 0
                for p in params:
                    p.copy_(gathered[offset : offset + p.numel()].view_as(p))
                    offset += p.numel()
        ''', {"state_is_this_rank_shard_only": "an optimizer created inside the function starts from zeros",
              "parameters_equal_torch_adamw": "after step 2"}),
    "7.3 the sum, not the mean": ("7.3", '''
        _reduce = reduce_scatter_gradients

        def reduce_scatter_gradients(params):
            return _reduce(params) * dist.get_world_size()
        ''', {"shard_of_the_mean_gradient": "is the SUM over the 3 ranks: divide by the world size"}),
    "7.3 all-reduce the whole gradient, then slice (ZeRO-1 as often drawn)": ("7.3", '''
        def reduce_scatter_gradients(params):
            world_size, rank = dist.get_world_size(), dist.get_rank()
            flat = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in params])
            size = math.ceil(flat.numel() / world_size)
            flat = torch.cat([flat, flat.new_zeros(world_size * size - flat.numel())])
            dist.all_reduce(flat)
            for p in params:
                p.grad = None
            return flat[rank * size : (rank + 1) * size].clone() / world_size
        ''', {"one_reduce_scatter": "the ledger shows [('all_reduce', 144)]; expected exactly one reduce_scatter"}),
    "7.4 no gradient communication: identical on every rank, yet wrong": ("7.4", '''
        def reduce_scatter_gradients(params):
            world_size, rank = dist.get_world_size(), dist.get_rank()
            flat = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in params])
            size = math.ceil(flat.numel() / world_size)
            flat = torch.cat([flat, flat.new_zeros(world_size * size - flat.numel())])
            for p in params:
                p.grad = None
            return flat[rank * size : (rank + 1) * size].clone()      # this rank's LOCAL gradient shard
        ''', {"equals_torch_ddp_adamw": "differ from torch DDP + AdamW's",
              "wire_bytes_equal_ddp_padding_aside": "the ledger shows collectives ['all_gather']"}),
    "7.4 the frozen layer in the flat parameter": ("7.4", '''
        _train = train_zero2

        def train_zero2(model, batches, *, lr, weight_decay):
            model.requires_grad_(True)
            return _train(model, batches, lr=lr, weight_decay=weight_decay)
        ''', {"frozen_parameters_untouched": "the frozen first layer (requires_grad=False) changed",
              "equals_torch_ddp_adamw": "differ from torch DDP + AdamW's",
              "optimizer_state_is_one_nth": "holds 240 bytes of optimizer state; expected"}),
}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("name", WRONG_MULTI_RANK)
def test_wrong_multi_rank_answers_fail(name):
    question, override, expected = WRONG_MULTI_RANK[name]
    result = check(question, solution_namespace(override))
    assert_fails(result, expected)
    if name.startswith("7.4 no gradient communication"):
        # the all-gather makes the ranks identical anyway: only the comparison with DDP and the ledger catch it
        assert "identical_on_every_rank_despite_different_data" not in failed(result)


@pytest.mark.timeout(120)
def test_textbook_adam_formula_passes():
    """Adam with other operations than torch's, list all_gather, vector_to_parameters: right too (within TOL)."""
    ns = solution_namespace('''
        def zero_adamw_step(params, grad_shard, state, *, lr, weight_decay, betas=(0.9, 0.999), eps=1e-8):
            rank, world_size = dist.get_rank(), dist.get_world_size()
            flat = torch.cat([p.detach().reshape(-1) for p in params])
            start, stop, pad = shard_range(flat.numel(), rank, world_size)
            p = torch.cat([flat[start:stop], flat.new_zeros(pad)]) * (1 - lr * weight_decay)
            (b1, b2), g = betas, grad_shard
            state["step"] += 1
            t = state["step"]
            state["exp_avg"].mul_(b1).add_((1 - b1) * g)
            state["exp_avg_sq"].mul_(b2).add_((1 - b2) * g * g)
            m_hat, v_hat = state["exp_avg"] / (1 - b1**t), state["exp_avg_sq"] / (1 - b2**t)
            p = p - lr * m_hat / (v_hat.sqrt() + eps)
            gathered = [torch.empty_like(p) for _ in range(world_size)]
            dist.all_gather(gathered, p)
            with torch.no_grad():
                torch.nn.utils.vector_to_parameters(torch.cat(gathered)[: flat.numel()].clone(), params)
        ''')
    result = check("7.2", ns)
    assert result.total == 5 and result.passed == result.total, result.lines


@pytest.mark.timeout(120)
def test_not_implemented_on_ranks_reports_todo():
    ns = solution_namespace('''
        def reduce_scatter_gradients(params):
            raise NotImplementedError("lab 7.3")
        ''')
    result = check("7.3", ns)
    assert result.not_implemented == result.total == 5, result.lines
