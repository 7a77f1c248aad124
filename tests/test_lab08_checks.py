"""Lab 08's public checks: there are as many as the lab says; realistic wrong answers fail, saying why.

The solution passes every check: tests/test_labs.py runs the solution notebook and asserts each check() result
(this file ran the same checks on the solution's answers to assert the same).
"""
import sys
import textwrap

import cloudpickle
import pytest

from helpers.grading import check
from helpers.grading.prepare.labgen import ROOT
from helpers.grading.registry import checks_for
from tests import lab_solution
from tests.lab_solution import assert_fails, failed
from tests.mistake_batch import Grouped, selected_ids

cloudpickle.register_pickle_by_value(sys.modules[__name__])  # ranks must not import this test module

SOLUTION = ROOT / "solutions" / "08_zero_3_fsdp.ipynb"
TOTALS = {"8.1": 5, "8.2": 4, "8.3": 3, "8.4": 4, "8.5": 7}


def solution_namespace(override=""):
    """The solution's imports, given code and answers exec'd into a fresh namespace; `override` then redefines some."""
    def wanted(cell):
        return cell.id == "imports" or cell.id.startswith("given") or lab_solution.is_answer(cell)

    return lab_solution.namespace(SOLUTION, wanted, override)


@pytest.mark.parametrize("question", sorted(TOTALS))
def test_every_question_has_its_number_of_checks(question):
    assert len(checks_for(question)) == TOTALS[question]


# Each wrong answer redefines one piece of the solution (a method is attached again to FlatShard); the solution's
# reduce_scatter_grads stays reachable as _solution_reduce_scatter_grads.
WRONG = {
    "8.1 torch.tensor_split instead of padding (unequal shards)": ("8.1", """
        _init = FlatShard.__init__

        def __init__(self, module):
            flat = torch.cat([p.detach().reshape(-1) for k, p in module.named_parameters() if "flat_shard" not in k])
            _init(self, module)
            self.flat_shard.data = torch.tensor_split(flat, dist.get_world_size())[dist.get_rank()].clone()

        FlatShard.__init__ = __init__
        """, {"shard_is_this_ranks_piece_of_the_padded_flat": "flat_shard is (15,); expected (16,)"}),
    "8.1 the shard is a view of the full buffer": ("8.1", """
        _init = FlatShard.__init__

        def __init__(self, module):
            _init(self, module)
            full = torch.zeros(self.padded_numel)
            size = self.padded_numel // dist.get_world_size()
            full[dist.get_rank() * size : (dist.get_rank() + 1) * size] = self.flat_shard.detach()
            self.flat_shard.data = full[dist.get_rank() * size : (dist.get_rank() + 1) * size]

        FlatShard.__init__ = __init__
        """, {"the_shard_is_the_units_only_parameter": "storage holds 192 bytes; expected 4 x 16"}),
    "8.1 the root takes the inner units' flat_shard too": ("8.1", """
        _init = FlatShard.__init__

        def __init__(self, module):
            for name, p in list(module.named_parameters()):
                if name.endswith(".flat_shard"):    # rename it, so that the solution does not skip it
                    owner = module.get_submodule(name.rpartition(".")[0])
                    del owner._parameters["flat_shard"]
                    owner.register_parameter("shard", p)
            _init(self, module)

        FlatShard.__init__ = __init__
        """, {"layout_recorded_in_named_parameters_order": "root unit (8 parameters), rank 0 of 3: (numel, "
                                                         "param_infos as names, shapes, numels, padded_numel) is "
                                                         "(24, ['0.shard', '1.weight', '1.bias']"}),
    "8.2 the shards gathered in reverse order": ("8.2", """
        @add_to_class(FlatShard)
        def unshard(self):
            self.flat.untyped_storage().resize_(self.padded_numel * self.flat.element_size())
            pieces = list(self.flat.data.chunk(dist.get_world_size()))
            dist.all_gather(pieces[::-1], self.flat_shard.data)
            views = self.flat.split(self.numels + [self.padded_numel - self.numel])
            for (owner, attr), view, shape in zip(self.param_infos, views, self.shapes):
                setattr(owner, attr, view.view(shape))
        """, {"views_equal_the_original_parameters": "block unit (47 parameters), rank 0 of 3: after unshard, "
                                                     "0.weight is [-0.4938, 0.4878, 1.9632, -0.1642]; expected "
                                                     "flat[0:20] shaped (4, 5), starting [0.141, 1.0241"}),
    "8.2 views split without the padding": ("8.2", """
        @add_to_class(FlatShard)
        def unshard(self):
            self.flat.untyped_storage().resize_(self.padded_numel * self.flat.element_size())
            dist.all_gather_single(self.flat.data, self.flat_shard.data)
            for (owner, attr), view, shape in zip(self.param_infos, self.flat.split(self.numels), self.shapes):
                setattr(owner, attr, view.view(shape))
        """, {"views_equal_the_original_parameters": "split_with_sizes expects split_sizes to sum exactly to 48"}),
    "8.2 gathered in place into flat (autograd's version counter)": ("8.2", """
        @add_to_class(FlatShard)
        def unshard(self):
            self.flat.untyped_storage().resize_(self.padded_numel * self.flat.element_size())
            with torch.no_grad():
                dist.all_gather_single(self.flat, self.flat_shard)
            views = self.flat.split(self.numels + [self.padded_numel - self.numel])
            for (owner, attr), view, shape in zip(self.param_infos, views, self.shapes):
                setattr(owner, attr, view.view(shape))
        """, {"gradients_reach_flat_grad_after_a_second_unshard": "Write the gathered values through self.flat.data"}),
    "8.3 references dropped, storage kept (frees nothing)": ("8.3", """
        @add_to_class(FlatShard)
        def reshard(self):
            for owner, attr in self.param_infos:
                owner.__dict__.pop(attr, None)
        """, {"frees_the_full_parameters": "after reshard, self.flat holds 192 bytes and the views autograd saved "
                                           "for backward 192"}),
    "8.3 a fresh flat instead of resizing": ("8.3", """
        @add_to_class(FlatShard)
        def reshard(self):
            self.flat = torch.zeros(self.padded_numel, requires_grad=True)
            self.flat.untyped_storage().resize_(0)
            for owner, attr in self.param_infos:
                owner.__dict__.pop(attr, None)
        """, {"frees_the_full_parameters": "reshard replaced self.flat by a new tensor; the views of the old one",
              "keeps_flat_for_the_next_unshard": "self.flat still the same tensor: False"}),
    "8.3 the views left on the modules": ("8.3", """
        @add_to_class(FlatShard)
        def reshard(self):
            self.flat.untyped_storage().resize_(0)
        """, {"removes_the_views_from_the_modules": "after reshard the modules still have ['0.weight', '0.bias'"}),
    "8.3 delattr without looking": ("8.3", """
        @add_to_class(FlatShard)
        def reshard(self):
            self.flat.untyped_storage().resize_(0)
            for owner, attr in self.param_infos:
                delattr(owner, attr)
        """, {"removes_the_views_from_the_modules": 'reshard raised ["before any unshard: AttributeError'}),
    "8.4 the sum, not the mean": ("8.4", """
        @add_to_class(FlatShard)
        def reduce_scatter_grads(self):
            self.flat.grad.mul_(dist.get_world_size())
            _solution_reduce_scatter_grads(self)
        """, {"shard_of_the_mean_gradient_accumulated": "is the SUM over the 3 ranks: divide by the world size"}),
    "8.4 overwrites instead of accumulating": ("8.4", """
        @add_to_class(FlatShard)
        def reduce_scatter_grads(self):
            self.flat_shard.grad = None
            _solution_reduce_scatter_grads(self)
        """, {"shard_of_the_mean_gradient_accumulated": "it overwrote the first; add it to flat_shard.grad"}),
    "8.4 all-reduce, then slice; flat.grad kept": ("8.4", """
        @add_to_class(FlatShard)
        def reduce_scatter_grads(self):
            size = self.padded_numel // dist.get_world_size()
            grad = self.flat.grad.clone()
            dist.all_reduce(grad)
            shard = grad[dist.get_rank() * size : (dist.get_rank() + 1) * size] / dist.get_world_size()
            self.flat_shard.grad = shard if self.flat_shard.grad is None else self.flat_shard.grad + shard
        """, {"one_reduce_scatter_of_the_padded_gradient": "the ledger shows [('all_reduce', 192)]",
              "frees_the_full_gradient": "expected only the shard's 4 x 16"}),
    "8.5 the optimizer built before sharding": ("8.5", """
        def train_fsdp(model, unit_names, batches, *, lr, momentum):
            optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum)
            units = [FlatShard(model.get_submodule(name)) for name in unit_names] + [FlatShard(model)]
            for unit in units:
                unit.register_hooks()
            for x, y in batches:
                optimizer.zero_grad()
                nn.functional.mse_loss(model(x), y).backward()
                optimizer.step()
            return units
        """, {"equals_torch_ddp_with_sgd": "differs from torch DDP + SGD(lr=0.05, momentum=0.9)"}),
    "8.5 no root unit (the head stays replicated, never averaged)": ("8.5", """
        def train_fsdp(model, unit_names, batches, *, lr, momentum):
            units = [FlatShard(model.get_submodule(name)) for name in unit_names]
            for unit in units:
                unit.register_hooks()
            optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum)
            for x, y in batches:
                optimizer.zero_grad()
                nn.functional.mse_loss(model(x), y).backward()
                optimizer.step()
            return units
        """, {"identical_on_every_rank_despite_different_data": "N=2: the root module has no flat_shard"}),
    "8.5 a unit type no submodule has is skipped without a word": ("8.5", """
        _train_fsdp = train_fsdp

        def train_fsdp(model, units, batches, **kwargs):
            held = [u for u in units if isinstance(u, str) or any(isinstance(m, u) for m in model.modules())]
            return _train_fsdp(model, held, batches, **kwargs)
        """, {"a_unit_type_no_submodule_has_is_an_error": "returned: a wrong type would silently shard nothing"}),
    "8.5 a unit type no submodule has: an error that does not name it": ("8.5", """
        _train_fsdp = train_fsdp

        def train_fsdp(model, units, batches, **kwargs):
            if any(not isinstance(u, str) and not any(isinstance(m, u) for m in model.modules()) for u in units):
                raise KeyError("unknown unit")
            return _train_fsdp(model, units, batches, **kwargs)
        """, {"a_unit_type_no_submodule_has_is_an_error": "raised KeyError: 'unknown unit'. Expected ValueError"}),
}


def _check_wrong(name):
    question, override, _ = WRONG[name]
    ns = solution_namespace("_solution_reduce_scatter_grads = FlatShard.reduce_scatter_grads\n")
    exec(textwrap.dedent(override), ns)
    return check(question, ns)


_checked = Grouped(_check_wrong)  # the wrong answers of one question go through check() together, launches batched


@pytest.mark.timeout(180)
@pytest.mark.parametrize("name", WRONG)
def test_wrong_answers_fail(name, request):
    question, _, expected = WRONG[name]
    result = _checked.result(name, [n for n in selected_ids(request) if WRONG[n][0] == question])
    assert_fails(result, expected)
    if name.startswith("8.5 the optimizer"):
        # the final all-gather makes the ranks identical anyway: only the comparison with DDP catches it
        assert "identical_on_every_rank_despite_different_data" not in failed(result)


@pytest.mark.timeout(180)
def test_not_implemented_on_ranks_reports_todo():
    ns = solution_namespace("""
        @add_to_class(FlatShard)
        def reshard(self):
            raise NotImplementedError("lab 8.3")
        """)
    result = check("8.3", ns)
    assert result.not_implemented == result.total == TOTALS["8.3"], result.lines
