"""Lab 03's public checks: there are as many as the lab says; realistic wrong answers fail, saying why.

The solution passes every check: tests/test_labs.py runs the solution notebook and asserts each check() result
(this file ran the same checks on the solution's definitions to assert the same).
"""
import textwrap

import pytest

from helpers.grading import check
from helpers.grading.prepare.labgen import ROOT
from helpers.grading.registry import checks_for
from tests import lab_solution
from tests.lab_solution import failed
from tests.mistake_batch import Grouped, selected_ids

SOLUTION = ROOT / "solutions" / "03_manual_ddp.ipynb"
TOTALS = {"3.1": 6, "3.2": 4, "3.3": 5, "3.4": 5}


def solution_namespace(override=""):
    """The solution's imports and answers exec'd into a fresh namespace; `override` then redefines some of them."""
    return lab_solution.namespace(SOLUTION, lambda cell: cell.id == "imports" or lab_solution.is_answer(cell), override)


@pytest.mark.parametrize("question", sorted(TOTALS))
def test_every_question_has_its_number_of_checks(question):
    assert len(checks_for(question)) == TOTALS[question]


ORDER = '''
    order = (torch.randperm(num_samples, generator=torch.Generator().manual_seed(seed + epoch)).tolist()
             if shuffle else list(range(num_samples)))
'''

WRONG_3_1 = {
    "strided, no padding or cut": (ORDER + "    return order[rank::world_size]\n", {
        "padding_matches_sampler": "returned [1, 4, 7]; DistributedSampler gives [1, 4, 7, 0]",
        "drop_last_matches_sampler": "DistributedSampler gives [0, 3, 6]",
        "rejects_a_bad_rank": "should raise ValueError"}),
    "pads once (chapter 03's version)": (ORDER + '''
    if not 0 <= rank < world_size:
        raise ValueError(rank)
    if drop_last:
        order = order[: num_samples // world_size * world_size]
    else:
        order = order + order[: math.ceil(num_samples / world_size) * world_size - num_samples]
    return order[rank::world_size]
''', {"datasets_smaller_than_world_size": "returned []; DistributedSampler gives [0]"}),
    "shuffle seeded without the epoch": (ORDER.replace("seed + epoch", "seed") + '''
    if not 0 <= rank < world_size:
        raise ValueError(rank)
    total = math.ceil(num_samples / world_size) * world_size
    while not drop_last and len(order) < total:
        order += order[: total - len(order)]
    return order[: num_samples // world_size * world_size][rank::world_size] if drop_last else order[rank::world_size]
''', {"shuffle_and_epochs_match_sampler": "epoch=1"}),
}


@pytest.mark.parametrize("name", WRONG_3_1)
def test_wrong_shard_indices_fail(name):
    body, expected = WRONG_3_1[name]
    ns = solution_namespace("def shard_indices(num_samples, rank, world_size, *, shuffle, seed, epoch, drop_last):\n"
                            + textwrap.dedent(body).replace("\n", "\n    ").rstrip() + "\n")
    fails = failed(check("3.1", ns))
    assert set(expected) <= set(fails), fails
    for check_name, message in expected.items():
        assert message in fails[check_name], fails[check_name]


WRONG_MULTI_RANK = {
    "3.2 parameters only, no buffers": ("3.2", '''
        def broadcast_parameters(model, src=0):
            with torch.no_grad():
                for p in model.parameters():
                    dist.broadcast(p, src=src)
        ''', {"parameters_and_buffers_come_from_src": "buffer '1.running_mean' is not rank 1's (broadcast "
                                                      "model.buffers() too"}),
    "3.2 broadcast outside no_grad": ("3.2", '''
        def broadcast_parameters(model, src=0):
            for t in [*model.parameters(), *model.buffers()]:
                dist.broadcast(t, src=src)
        ''', {"outside_autograd": "autograd recorded c10d::broadcast_"}),
    "3.3 one all_reduce per parameter (chapter 03's version)": ("3.3", '''
        def average_gradients(model):
            for p in model.parameters():
                if p.requires_grad:
                    if p.grad is None:
                        p.grad = torch.zeros_like(p)
                    dist.all_reduce(p.grad)
                    p.grad /= dist.get_world_size()
        ''', {"one_flat_all_reduce": "4 all_reduce calls (payloads [120, 20, 60, 12] bytes); flatten"}),
    "3.3 averages the parameters (the picotron bug)": ("3.3", '''
        def average_gradients(model):
            params = [p for p in model.parameters() if p.requires_grad]
            with torch.no_grad():
                flat = _flatten_dense_tensors([p.detach() for p in params])
                dist.all_reduce(flat)
                flat /= dist.get_world_size()
                for p, averaged in zip(params, _unflatten_dense_tensors(flat, params)):
                    p.copy_(averaged)
        ''', {"gradients_become_the_mean_over_ranks": "average_gradients changed the parameters",
              "identical_on_every_rank": "differs between rank 0 and rank 1"}),
    "3.3 sum without the division": ("3.3", '''
        def average_gradients(model):
            params = [p for p in model.parameters() if p.requires_grad]
            grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
            flat = _flatten_dense_tensors(grads)
            dist.all_reduce(flat)
            for p, total in zip(params, _unflatten_dense_tensors(flat, grads)):
                p.grad = total.clone()
        ''', {"gradients_become_the_mean_over_ranks": "are the SUM over the 3 ranks"}),
    "3.4 hook that averages parameters": ("3.4", '''
        def average_gradients(model):
            pass

        _train = train_manual_ddp

        def train_manual_ddp(model, X, Y, **kwargs):
            def hook(param):                     # register_post_accumulate_grad_hook passes the parameter
                dist.all_reduce(param)
                param /= dist.get_world_size()
            for p in model.parameters():
                p.register_post_accumulate_grad_hook(hook)
            return _train(model, X, Y, **kwargs)
        ''', {"identical_on_every_rank_despite_different_data": "rank 1's parameters differ from rank 0's",
              "equals_one_process_on_the_global_batch": "tolerance 1e-06",
              "equals_torch_ddp": "DistributedDataParallel",
              "one_all_reduce_of_4_psi_bytes_per_step": "24 all_reduce calls"}),
    "3.4 per-parameter all_reduce: right numbers, wrong collectives": ("3.4", '''
        def average_gradients(model):
            for p in model.parameters():
                dist.all_reduce(p.grad)
                p.grad /= dist.get_world_size()
        ''', {"one_all_reduce_of_4_psi_bytes_per_step": "expected exactly one all_reduce of 4 * psi = 264 bytes"}),
    "3.4 forgot the epoch (set_epoch)": ("3.4", '''
        _shard = shard_indices

        def shard_indices(num_samples, rank, world_size, *, shuffle, seed, epoch, drop_last):
            return _shard(num_samples, rank, world_size, shuffle=shuffle, seed=seed, epoch=0, drop_last=drop_last)
        ''', {"equals_one_process_on_the_global_batch": "the same order in every epoch",
              "returns_each_rank_local_losses": "are not the mean squared errors of its own batches"}),
}


def _check_wrong(name):
    question, override, _ = WRONG_MULTI_RANK[name]
    return check(question, solution_namespace(override))


_checked = Grouped(_check_wrong)  # the wrong answers of one question go through check() together, launches batched


@pytest.mark.timeout(120)
@pytest.mark.parametrize("name", WRONG_MULTI_RANK)
def test_wrong_multi_rank_answers_fail(name, request):
    question, _, expected = WRONG_MULTI_RANK[name]
    fails = failed(_checked.result(name, [n for n in selected_ids(request) if WRONG_MULTI_RANK[n][0] == question]))
    assert set(expected) <= set(fails), fails
    for check_name, message in expected.items():
        assert message in fails[check_name], fails[check_name]


@pytest.mark.timeout(120)
def test_not_implemented_on_ranks_reports_todo():
    ns = solution_namespace('''
        def average_gradients(model):
            raise NotImplementedError("lab 3.3")
        ''')
    result = check("3.3", ns)
    assert result.not_implemented == result.total == 5, result.lines


@pytest.mark.timeout(120)
def test_fixing_a_helper_the_answer_calls_reruns_the_check():
    # A student fixes a helper of theirs and reruns only that cell and the check cell: the answer's function object
    # is the same, so a run keyed by it replayed the old failure (shared_run.definitions keys by every definition).
    ns = solution_namespace('''
        def _mean(flat):
            return flat  # the sum: forgot to divide by the world size

        def average_gradients(model):
            params = [p for p in model.parameters() if p.requires_grad]
            grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
            flat = torch.cat([g.reshape(-1) for g in grads])
            dist.all_reduce(flat)
            flat = _mean(flat)
            for p, g, averaged in zip(params, grads, flat.split([g.numel() for g in grads])):
                p.grad = averaged.view_as(g).clone()
    ''')
    assert check("3.3", ns).passed < 5
    exec("def _mean(flat):\n    return flat / dist.get_world_size()\n", ns)
    result = check("3.3", ns)
    assert result.passed == result.total == 5, result.lines
