"""Lab 04's public checks: realistic wrong answers fail with a useful message.

The solution passes every check: tests/test_labs.py runs the solution notebook and asserts each check() result
(this file ran the same checks on the solution's definitions to assert the same).
"""
import sys

import cloudpickle
import pytest
import torch
import torch.distributed as dist
import torch.nn as nn

from helpers.grading.checks.lab04 import common as lab04
from helpers.grading.checks.lab04 import q1_assign_buckets
from helpers.grading.prepare.labgen import ROOT
from helpers.launch import launch
from tests.lab_solution import assert_report_mentions as assert_fails
from tests.lab_solution import definitions

SOLUTION = ROOT / "solutions" / "04_bucketing_and_overlap.ipynb"

# Rank functions below travel by value: by reference every rank would import this module and pytest with it.
cloudpickle.register_pickle_by_value(sys.modules[__name__])


def solution_namespace(extra_source=""):
    """The solution's definitions, with extra_source (a wrong answer) replacing one of them."""
    return definitions(SOLUTION, extra_source)


# torch 2.13's assignment of each case the checks use: the test fails on the upgrade that changes or removes
# dist._compute_bucket_assignment_by_size, which the checks compare with (they hold no rule of their own).
TORCH_BUCKETS = {"the lab MLP, cap 400 B": [[7, 6, 5, 4], [3, 2], [1, 0]],
                 "cap 1 B: every tensor alone": [[7], [6], [5], [4], [3], [2], [1], [0]],
                 "cap 1 GB: one bucket": [[7, 6, 5, 4, 3, 2, 1, 0]],
                 "four 16-byte tensors, cap 32 B": [[3, 2], [1, 0]],
                 "float16 tensors (2 bytes each), cap 100 B": [[4], [3, 2], [1, 0]]}


def test_torch_gives_the_recorded_buckets():
    """torch's _compute_bucket_assignment_by_size closes a bucket at >= cap, last parameter first, as 4.1 says."""
    cases = q1_assign_buckets._assignment_cases()
    assert {label: lab04.torch_buckets(params, cap) for label, params, cap in cases} == TORCH_BUCKETS
    assert lab04.torch_buckets(list(lab04.make_model(0).parameters()), lab04.CAP_BYTES) == lab04.MLP_BUCKETS


# --- 4.1 -------------------------------------------------------------------------------------------

FORWARD_ORDER = '''
def assign_buckets(params, bucket_cap_bytes):
    buckets, current, filled = [], [], 0
    for index in range(len(params)):
        current.append(index)
        filled += params[index].numel() * params[index].element_size()
        if filled >= bucket_cap_bytes:
            buckets.append(current)
            current, filled = [], 0
    return buckets + ([current] if current else [])
'''

COUNTS_ELEMENTS = '''
def assign_buckets(params, bucket_cap_bytes):
    buckets, current, filled = [], [], 0
    for index in reversed(range(len(params))):
        current.append(index)
        filled += params[index].numel()
        if filled >= bucket_cap_bytes:
            buckets.append(current)
            current, filled = [], 0
    return buckets + ([current] if current else [])
'''

STAYS_UNDER_CAP = '''
def assign_buckets(params, bucket_cap_bytes):
    buckets, current, filled = [], [], 0
    for index in reversed(range(len(params))):
        size = params[index].numel() * params[index].element_size()
        if current and filled + size > bucket_cap_bytes:
            buckets.append(current)
            current, filled = [], 0
        current.append(index)
        filled += size
    return buckets + ([current] if current else [])
'''


def test_forward_order_fails():
    assert_fails("4.1", solution_namespace(FORWARD_ORDER), "grouped from the FIRST parameter")


def test_counting_elements_fails():
    assert_fails("4.1", solution_namespace(COUNTS_ELEMENTS), "counted elements, not bytes")


def test_keeping_buckets_under_the_cap_fails():
    assert_fails("4.1", solution_namespace(STAYS_UNDER_CAP), "torch closes a bucket at the first tensor")


# --- 4.2 -------------------------------------------------------------------------------------------

def bucket_with(add_grad="", finish=""):
    """A Bucket subclass of the solution's with one method replaced."""
    return f'''
_Solution = Bucket
class Bucket(_Solution):
{add_grad}
{finish}
'''


AVERAGES_PARAMETERS = bucket_with(add_grad='''
    def add_grad(self, param):
        self.views[param].copy_(param.detach())        # picotron's bug: the hook receives the parameter
        self.pending -= 1
        if self.pending == 0:
            self.buffer.div_(dist.get_world_size())
            self.work = dist.all_reduce(self.buffer, async_op=True)
''')

NO_WAIT = bucket_with(finish='''
    def finish(self):
        for p in self.params:                           # forgot self.work.wait()
            p.grad.copy_(self.views[p])
        self.pending, self.work = len(self.params), None
''')

PER_PARAMETER = bucket_with(add_grad='''
    def add_grad(self, param):
        view = self.views[param]
        view.copy_(param.grad)
        view.div_(dist.get_world_size())
        self.work = dist.all_reduce(view, async_op=True)   # one message per parameter
        self.work.wait()
        self.pending -= 1
''')

WAITS_IN_ADD_GRAD = bucket_with(add_grad='''
    def add_grad(self, param):
        self.views[param].copy_(param.grad)
        self.pending -= 1
        if self.pending == 0:
            self.buffer.div_(dist.get_world_size())
            self.work = dist.all_reduce(self.buffer, async_op=True)
            self.work.wait()                            # synchronous: no overlap
''')

NO_RESET = bucket_with(finish='''
    def finish(self):
        self.work.wait()
        for p in self.params:
            p.grad.copy_(self.views[p])
''')


@pytest.mark.timeout(120)
def test_bucket_averaging_parameters_fails():
    assert_fails("4.2", solution_namespace(AVERAGES_PARAMETERS), "the average of the PARAMETERS")


@pytest.mark.timeout(120)
def test_bucket_without_wait_fails():
    assert_fails("4.2", solution_namespace(NO_WAIT), "wait() on the work handle")


@pytest.mark.timeout(120)
def test_bucket_with_one_all_reduce_per_parameter_fails():
    assert_fails("4.2", solution_namespace(PER_PARAMETER), "not one per parameter")


@pytest.mark.timeout(120)
def test_bucket_waiting_in_add_grad_fails():
    assert_fails("4.2", solution_namespace(WAITS_IN_ADD_GRAD), "so it waited for the all-reduce")


@pytest.mark.timeout(120)
def test_bucket_not_reset_fails():
    assert_fails("4.2", solution_namespace(NO_RESET), "reset pending")


# --- 4.3 -------------------------------------------------------------------------------------------

def reducer_with(init_tail="", finalize=""):
    """A Reducer whose __init__ tail or finalize() is replaced (the broadcast stays)."""
    init = f'''
    def __init__(self, model, bucket_cap_mb=25.0):
        self.params = [p for p in model.parameters() if p.requires_grad]
        with torch.no_grad():
            for t in [*model.parameters(), *model.buffers()]:
                dist.broadcast(t, src=0)
{init_tail}
''' if init_tail else ""
    return f'''
_Solution = Reducer
class Reducer(_Solution):
{init}
{finalize}
'''


HOOK_AVERAGES_PARAMETERS = reducer_with(init_tail='''
        def hook(param):                               # picotron: all-reduce the PARAMETER
            with torch.no_grad():
                dist.all_reduce(param)
                param /= dist.get_world_size()
        for p in self.params:
            p.register_post_accumulate_grad_hook(hook)
        self.buckets = []
''', finalize='''
    def finalize(self):
        pass
''')

ALL_REDUCE_IN_FINALIZE = reducer_with(init_tail='''
        cap = int(bucket_cap_mb * 2**20)
        self.buckets = [[self.params[i] for i in b] for b in assign_buckets(self.params, cap)]
''', finalize='''
    def finalize(self):                                # buckets, but only after backward: no overlap
        for bucket in self.buckets:
            flat = torch.cat([p.grad.reshape(-1) for p in bucket])
            dist.all_reduce(flat)
            flat /= dist.get_world_size()
            for p, piece in zip(bucket, flat.split([p.numel() for p in bucket])):
                p.grad.copy_(piece.view_as(p))
''')

PER_PARAMETER_HOOKS = reducer_with(init_tail='''
        self.works = []
        def hook(param):
            param.grad /= dist.get_world_size()
            self.works.append(dist.all_reduce(param.grad, async_op=True))
        for p in self.params:
            p.register_post_accumulate_grad_hook(hook)
''', finalize='''
    def finalize(self):
        for work in self.works:
            work.wait()
        self.works = []
''')

FINALIZE_WITHOUT_WAIT = reducer_with(finalize='''
    def finalize(self):
        for bucket in self.buckets:                     # copies back, never waits
            for p in bucket.params:
                p.grad.copy_(bucket.views[p])
            bucket.pending, bucket.work = len(bucket.params), None
''')


@pytest.mark.timeout(120)
def test_reducer_averaging_parameters_fails():
    assert_fails("4.3", solution_namespace(HOOK_AVERAGES_PARAMETERS), "instead of `param.grad`")


@pytest.mark.timeout(120)
def test_reducer_reducing_after_backward_fails():
    assert_fails("4.3", solution_namespace(ALL_REDUCE_IN_FINALIZE), "launch each bucket from the gradient hooks")


@pytest.mark.timeout(120)
def test_reducer_with_one_all_reduce_per_parameter_fails():
    assert_fails("4.3", solution_namespace(PER_PARAMETER_HOOKS), "8 all-reduces in one step, expected 3")


@pytest.mark.timeout(120)
def test_reducer_finalize_without_wait_fails():
    assert_fails("4.3", solution_namespace(FINALIZE_WITHOUT_WAIT), "wait() on the work handle")


# --- 4.4 -------------------------------------------------------------------------------------------

STEP_BEFORE_FINALIZE = '''
def train_bucketed(model, batches, lr, bucket_cap_mb):
    reducer = Reducer(model, bucket_cap_mb)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    losses = []
    for x, y in batches:
        optimizer.zero_grad(set_to_none=True)
        loss = F.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()                               # too early: this rank's own gradient
        reducer.finalize()
        losses.append(loss.item())
    return losses
'''

REDUCER_PER_STEP = '''
def train_bucketed(model, batches, lr, bucket_cap_mb):
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    losses = []
    for x, y in batches:
        reducer = Reducer(model, bucket_cap_mb)        # new hooks at every step, on top of the old ones
        optimizer.zero_grad(set_to_none=True)
        loss = F.mse_loss(model(x), y)
        loss.backward()
        reducer.finalize()
        optimizer.step()
        losses.append(loss.item())
    return losses
'''


@pytest.mark.timeout(120)
def test_stepping_before_finalize_fails():
    assert_fails("4.4", solution_namespace(STEP_BEFORE_FINALIZE), "finalize() BEFORE optimizer.step()")


@pytest.mark.timeout(120)
def test_a_reducer_per_step_fails():
    assert_fails("4.4", solution_namespace(REDUCER_PER_STEP), "Build ONE Reducer before the loop")


def test_helpers_see_the_tolerance():
    assert lab04.TOL <= 1e-5 and torch.finfo(torch.float32).eps < lab04.TOL


# --- the given Reducer constructor ------------------------------------------------------------------

def constructed_state(reducer_class):
    """A rank's model state after the Reducer's constructor: it began different on every rank."""
    torch.manual_seed(dist.get_rank())
    model = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.Linear(4, 2))
    model[0].bias.requires_grad_(False)  # frozen: no gradient, yet part of what every rank must agree on
    model[1].running_mean += dist.get_rank()  # a buffer
    reducer_class(model, bucket_cap_mb=25.0)
    return {name: t.clone() for name, t in model.state_dict().items()}


@pytest.mark.timeout(120)
def test_the_given_reducer_starts_every_rank_from_rank_0s_parameters_and_buffers():
    # DDP's constructor broadcasts every parameter and buffer (torch/distributed/utils.py, _sync_module_states);
    # the given code said it did as DDP does while it skipped frozen parameters and buffers.
    states = launch(constructed_state, 3, args=(solution_namespace()["Reducer"],), backend="gloo", hang_timeout=30)
    for rank, state in enumerate(states[1:], 1):
        differ = [name for name, t in states[0].items() if not torch.equal(state[name], t)]
        assert not differ, f"rank {rank} differs from rank 0 in {differ} after Reducer(model)"


# --- 4.5 -------------------------------------------------------------------------------------------
# Driven through check() once, by tests/test_mistakes.py (tests/mistakes/lab04.py), which also holds the first line
# of each report to the mistake and its fix.

def bucketed_ddp(init="self.module = module\n        self.reducer = Reducer(module, bucket_cap_mb)",
                 forward=None, finish="self.reducer.finalize()", module_init="super().__init__()", name="module"):
    """A BucketedDDP written out whole, with one part changed; the defaults are the solution's."""
    forward = forward or f'''unfinished = [b for b in self.reducer.buckets
                      if b.work is not None or b.pending != len(b.params)]
        if unfinished:
            raise RuntimeError("call finish_gradient_synchronization() after backward()")
        return self.{name}(*args, **kwargs)'''
    return f'''
class BucketedDDP(nn.Module):
    def __init__(self, module, bucket_cap_mb=25.0):
        {module_init}
        {init}

    def forward(self, *args, **kwargs):
        {forward}

    def finish_gradient_synchronization(self):
        {finish}
'''


FINISH_DOES_NOTHING = bucketed_ddp(finish="pass                                   # the buckets are never waited for")
NO_REFUSAL = bucketed_ddp(forward="return self.module(*args, **kwargs)    # a forgotten finish goes unnoticed")
REDUCER_IN_FORWARD = bucketed_ddp(
    init="self.module, self.cap = module, bucket_cap_mb",
    forward="self.reducer = Reducer(self.module, self.cap)   # a broadcast and new hooks at every call\n"
            "        return self.module(*args, **kwargs)")
KEPT_AS_MODEL = bucketed_ddp(init="self.model = module                    # torch's name is .module\n"
                                  "        self.reducer = Reducer(module, bucket_cap_mb)", name="model")
NO_MODULE_INIT = bucketed_ddp(module_init="pass                                   # nn.Module.__init__ never runs")



def test_a_reducer_that_copied_some_buckets_back_unfinished_is_told_to_wait():
    # Under load, finalize() without wait() can leave some buckets averaged and others not: each of those holds this
    # rank's own gradient / world size. The hint must name them (the whole gradient then matches no wrong answer).
    from helpers.grading.checks.lab04.q3_reducer import _stale_buckets

    per_rank = [[torch.full((2,), 1.0 + q), torch.full((3,), 10.0 * (q + 1))] for q in range(3)]
    mean = [sum(g[i] for g in per_rank) / 3 for i in range(2)]
    hint = _stale_buckets([per_rank[0][0] / 3, mean[1]], per_rank, 0)
    assert "Parameters [0] equal this rank's own gradient divided by the world size" in hint
    assert "wait() on the work handle first" in hint
    assert _stale_buckets(mean, per_rank, 0) == ""


def test_a_buffer_copied_while_the_ring_still_added_into_it_is_told_to_wait():
    # Seen in make test: finalize() copied a bucket back while Gloo's ring was adding the ranks in, one at a time;
    # no parameter was wholly averaged or wholly its own, so neither hint above fired and the report said nothing.
    from helpers.grading.checks.lab04.q3_reducer import _stale_buckets

    per_rank = [[torch.tensor([1.0, 2.0, 3.0]) * (q + 1) + q, torch.full((2,), 10.0 * (q + 1))] for q in range(3)]
    total = [sum(g[i] for g in per_rank) for i in range(2)]
    # element 0: rank 0 alone; element 1: ranks 0 and 2; element 2: all three; the second tensor: ranks 0 and 1
    mid_ring = [torch.stack([per_rank[0][0][0], per_rank[0][0][1] + per_rank[2][0][1], total[0][2]]) / 3,
                (per_rank[0][1] + per_rank[1][1]) / 3]
    hint = _stale_buckets(mid_ring, per_rank, 0)
    assert "sums over only some of the ranks" in hint and "wait() on the work handle first" in hint
    # A wrong answer that is no partial sum (twice the mean) gets no such hint.
    assert _stale_buckets([2 * t / 3 for t in total], per_rank, 0) == ""
