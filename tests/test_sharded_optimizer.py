"""chapters/capstone/zero.py's ShardedOptimizer on 3 ranks: equal to the unsharded optimizer and to PyTorch's
ZeroRedundancyOptimizer, with the state of each parameter on exactly one rank; bad input rejected before any rank."""
import io
import sys

import cloudpickle
import pytest
import torch
import torch.distributed as dist
import torch.nn as nn

from chapters.capstone import zero
from chapters.capstone.zero import ShardedOptimizer
from helpers.backend import rank_device
from helpers.comm import CommLedger
from helpers.launch import launch
from helpers.memory import state_bytes

# By value, so that the ranks need not import this module (and pytest with it) nor find chapters/ on their path.
cloudpickle.register_pickle_by_value(sys.modules[__name__])
cloudpickle.register_pickle_by_value(zero)

WORLD_SIZE, STEPS, TOL = 3, 5, 1e-6


def make_model():
    torch.manual_seed(0)                              # the same start on every rank; tensors of 6 sizes
    model = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 3))
    return model.to(rank_device())


def make_batch(step):
    generator = torch.Generator().manual_seed(100 * step + dist.get_rank())   # different data on every rank
    x = torch.randn(4, 6, generator=generator)
    return x.to(rank_device()), torch.sin(x[:, :3]).to(rank_device())


def sgd_groups(model):
    return [{"params": list(model.parameters())}]


def adamw_groups(model):
    # two groups, as usual for AdamW: weight decay on the matrices, none (and another lr) on the biases
    return [{"params": [p for p in model.parameters() if p.dim() == 2], "lr": 1e-2, "weight_decay": 0.1},
            {"params": [p for p in model.parameters() if p.dim() == 1], "lr": 3e-2, "weight_decay": 0.0}]


OPTIMIZERS = {"sgd_momentum": (sgd_groups, torch.optim.SGD, {"lr": 0.05, "momentum": 0.9}),
              "adamw_two_groups": (adamw_groups, torch.optim.AdamW, {"lr": 1e-3})}


def average_gradients(model):
    # what DDP does during backward: the mean over ranks, by all-reduce
    for p in model.parameters():
        dist.all_reduce(p.grad)
        p.grad /= dist.get_world_size()


def train(model, optimizer, sync, steps=range(STEPS)):
    for step in steps:
        x, y = make_batch(step)
        optimizer.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        sync(model, optimizer)
        optimizer.step()


def zero1(model, optimizer):
    average_gradients(model)


def zero2(model, optimizer):
    optimizer.reduce_gradients()


def flat(model):
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()]).cpu()


def sharded_against_unsharded(name, sync):
    """(ours, unsharded, ZeroRedundancyOptimizer) parameters after STEPS steps, and who holds which state."""
    # Imported in the ranks only: torch.distributed.optim scripts its functional optimizers at import, 2 CPU-s that
    # every pytest worker paid when this module was collected.
    from torch.distributed.optim import ZeroRedundancyOptimizer

    groups, cls, kwargs = OPTIMIZERS[name]
    runs = {}
    for label, build in [("ours", lambda m: ShardedOptimizer(groups(m), cls, **kwargs)),
                         ("unsharded", lambda m: cls(groups(m), **kwargs)),
                         ("torch_zero", lambda m: ZeroRedundancyOptimizer(groups(m), optimizer_class=cls, **kwargs))]:
        model = make_model()
        index = {p: i for i, p in enumerate(model.parameters())}
        optimizer = build(model)
        train(model, optimizer, sync if label == "ours" else zero1)
        runs[label] = flat(model)
        if label == "ours":
            runs["state"] = sorted(index[p] for p in optimizer.optim.state)
            runs["wrapper_state"] = sorted(index[p] for p in optimizer.state)
            runs["owner"] = {index[p]: rank for p, rank in optimizer.owner.items()}
            runs["memory"] = state_bytes(model, optimizer)
            runs["grads"] = sorted(index[p] for p in model.parameters() if p.grad is not None)
        if label == "torch_zero":
            runs["torch_owner"] = {index[p]: rank for p, rank in optimizer._param_to_rank.items()}
    return runs


@pytest.fixture(scope="module")
def runs():
    """runs[(optimizer, stage)][rank], and runs[name][rank] for the rank functions further down (add_group_later,
    sends_per_step, resumed_from_a_shard): one launch of 3 ranks for everything (a launch costs ~2.5 CPU-s)."""
    def all_runs():
        out = {(name, stage): sharded_against_unsharded(name, sync)
               for name in OPTIMIZERS for stage, sync in [("zero1", zero1), ("zero2", zero2)]}
        for fn in (add_group_later, sends_per_step, resumed_from_a_shard):
            out[fn.__name__] = fn()
        return out
    by_rank = launch(all_runs, WORLD_SIZE, backend="gloo", hang_timeout=60)
    return {key: [ranks[key] for ranks in by_rank] for key in by_rank[0]}


@pytest.mark.timeout(180)
@pytest.mark.parametrize("stage", ["zero1", "zero2"])
@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_equals_the_unsharded_optimizer_on_every_rank(runs, name, stage):
    ranks = runs[name, stage]
    for rank, run in enumerate(ranks):
        assert torch.equal(run["ours"], ranks[0]["ours"]), f"{name} {stage}: rank {rank}'s parameters differ from 0's"
        error = (run["ours"] - run["unsharded"]).abs().max().item()
        assert error < TOL, f"{name} {stage} rank {rank}: max |sharded - unsharded| = {error:.1e} after {STEPS} steps"
    moved = (ranks[0]["ours"] - flat(make_model())).abs().max().item()
    assert moved > 1e-3, f"{name}: the parameters barely moved ({moved:.1e}), so the comparison proves nothing"


@pytest.mark.timeout(180)
@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_equals_torch_zero_redundancy_optimizer(runs, name):
    for rank, run in enumerate(runs[name, "zero1"]):
        error = (run["ours"] - run["torch_zero"]).abs().max().item()
        assert error < TOL, f"{name} rank {rank}: max |ours - ZeroRedundancyOptimizer| = {error:.1e}"
        assert run["owner"] == run["torch_owner"], "the owners should follow ZeroRedundancyOptimizer's greedy rule"


@pytest.mark.timeout(180)
@pytest.mark.parametrize("stage", ["zero1", "zero2"])
@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_each_parameter_has_state_on_exactly_one_rank(runs, name, stage):
    ranks = runs[name, stage]
    n_params = len(list(make_model().parameters()))
    held = [index for run in ranks for index in run["state"]]
    assert sorted(held) == list(range(n_params)), f"{name} {stage}: state held per rank {[r['state'] for r in ranks]}"
    for rank, run in enumerate(ranks):
        assert run["state"] == sorted(i for i, owner in run["owner"].items() if owner == rank)
        assert run["wrapper_state"] == run["state"], "optimizer.state should be the local optimizer's, not a copy"
        assert len(run["state"]) < n_params, f"rank {rank} holds state for every parameter: nothing is sharded"


@pytest.mark.timeout(180)
def test_zero2_keeps_only_the_owned_gradients(runs):
    ranks = runs["adamw_two_groups", "zero2"]
    sizes = [p.numel() for p in make_model().parameters()]
    for rank, run in enumerate(ranks):
        owned = [i for i, owner in run["owner"].items() if owner == rank]
        assert run["grads"] == sorted(owned), f"rank {rank} keeps gradients {run['grads']}, owns {owned}"
        assert run["memory"]["grads"] == 4 * sum(sizes[i] for i in owned)
    zero1_grads = runs["adamw_two_groups", "zero1"][0]["memory"]["grads"]
    assert zero1_grads == 4 * sum(sizes), "ZeRO-1 keeps every (averaged) gradient"


def add_group_later():
    """AdamW on the matrices for 2 steps, then add_param_group(biases) and 3 more steps: ours and unsharded."""
    out = {}
    for label in ("ours", "unsharded"):
        model = make_model()
        weights, biases = adamw_groups(model)
        optimizer = (ShardedOptimizer([weights], torch.optim.AdamW, lr=1e-3) if label == "ours"
                     else torch.optim.AdamW([weights], lr=1e-3))
        train(model, optimizer, zero1, range(2))
        before = dict(optimizer.owner) if label == "ours" else None
        optimizer.add_param_group(biases)
        train(model, optimizer, zero1, range(2, STEPS))
        out[label] = flat(model)
        if label == "ours":
            out["owners_kept"] = all(optimizer.owner[p] == rank for p, rank in before.items())
            out["state"] = len(optimizer.state)
            out["group_lrs"] = [group["lr"] for group in optimizer.optim.param_groups]
    return out


@pytest.mark.timeout(180)  # the module's launch may run in this test's setup
def test_add_param_group_after_construction(runs):
    ranks = runs["add_group_later"]
    for rank, run in enumerate(ranks):
        assert torch.equal(run["ours"], ranks[0]["ours"]), f"rank {rank}'s parameters differ from rank 0's"
        error = (run["ours"] - run["unsharded"]).abs().max().item()
        assert error < TOL, f"rank {rank}: max |sharded - unsharded| = {error:.1e} with a group added after step 2"
        assert run["owners_kept"], "add_param_group moved an old parameter to another rank (its state would be lost)"
        assert run["group_lrs"] == [1e-2, 3e-2], "the local optimizer should get the new group, empty or not"
    assert sum(run["state"] for run in ranks) == 6, "the 6 tensors' state, each on one rank"


def sends_per_step():
    """Wire bytes of one step: DDP-style all-reduce + ZeRO-1, and ZeRO-2's reduce + broadcast."""
    out = {}
    for stage, sync in [("zero1", zero1), ("zero2", zero2)]:
        model = make_model()
        optimizer = ShardedOptimizer(model.parameters(), torch.optim.SGD, lr=0.1)
        with CommLedger() as ledger:
            train(model, optimizer, sync, range(1))
        out[stage] = sum(t["wire_bytes"] for t in ledger.totals().values())
    return out


@pytest.mark.timeout(180)  # the module's launch may run in this test's setup
def test_zero2_sends_ddps_bytes_and_zero1_half_more(runs):
    sent = runs["sends_per_step"][0]
    psi_bytes = 4 * sum(p.numel() for p in make_model().parameters())
    ddp = 2 * (WORLD_SIZE - 1) / WORLD_SIZE * psi_bytes          # a ring all-reduce of every gradient
    assert abs(sent["zero2"] - ddp) <= 12, f"ZeRO-2 sent {sent['zero2']} B per step, DDP's all-reduce {ddp:.0f} B"
    assert abs(sent["zero1"] - 1.5 * ddp) <= 12, f"ZeRO-1 sent {sent['zero1']} B per step, 1.5x DDP is {1.5 * ddp:.0f}"


@pytest.mark.timeout(30)
@pytest.mark.parametrize("bad", [torch.optim.AdamW([nn.Parameter(torch.zeros(2))], lr=1e-3), "adamw", nn.Linear])
def test_an_optimizer_instance_or_name_is_rejected_with_what_to_pass(bad):
    expected = r"optimizer_cls is .*, not an optimizer class: pass the class itself, a subclass of torch.optim"
    with pytest.raises(TypeError, match=expected):
        ShardedOptimizer([nn.Parameter(torch.zeros(2))], bad, lr=1e-3)


@pytest.mark.timeout(30)
def test_without_a_process_group_it_says_to_start_one():
    assert not dist.is_initialized()
    with pytest.raises(RuntimeError, match="call dist.init_process_group first"):
        ShardedOptimizer([nn.Parameter(torch.zeros(2))], torch.optim.SGD, lr=1e-3)


def resumed_from_a_shard():
    """Train 2 steps, save each rank's shard, load it into a new optimizer on a copy of the model, train 3 more;
    against 5 uninterrupted steps."""
    groups, optimizer_cls, kwargs = OPTIMIZERS["adamw_two_groups"]
    model = make_model()
    optimizer = ShardedOptimizer(groups(model), optimizer_cls, **kwargs)
    train(model, optimizer, zero1, steps=range(2))
    saved = io.BytesIO()  # as to a file: state_dict() holds the live state tensors, a checkpoint holds copies
    torch.save(optimizer.state_dict(), saved)
    saved.seek(0)
    shard = torch.load(saved)
    resumed = make_model()
    resumed.load_state_dict(model.state_dict())
    again = ShardedOptimizer(groups(resumed), optimizer_cls, **kwargs)
    again.load_state_dict(shard)
    linked = again.state is again.optim.state and len(again.state) == len(optimizer.state)
    train(resumed, again, zero1, steps=range(2, STEPS))
    train(model, optimizer, zero1, steps=range(2, STEPS))
    return linked, (flat(resumed) - flat(model)).abs().max().item()


@pytest.mark.timeout(180)  # the module's launch may run in this test's setup
def test_a_shard_saved_and_loaded_resumes_exactly(runs):
    for rank, (linked, diff) in enumerate(runs["resumed_from_a_shard"]):
        assert linked, f"rank {rank}: after load_state_dict, state is not the local optimizer's"
        assert diff == 0.0, f"rank {rank}: resumed run differs by {diff:.2e} from the uninterrupted one"
