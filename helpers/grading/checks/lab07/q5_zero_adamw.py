"""Checks of lab 7.5: ZeroAdamW, the 7.2 and 7.3 functions as a torch.optim.Optimizer, against torch.optim.AdamW.

One launch on 3 ranks serves every check. The model has a frozen first layer and two parameter groups, as AdamW is
usually set up (weight decay on the matrices, none and another lr on the biases); the user passes every parameter,
frozen ones included, as they would to torch.optim.AdamW. Halfway through, the learning rates are changed through
param_groups, as an LR scheduler does. The reference is one process with torch.optim.AdamW on all ranks' batches.
"""
import math

import torch
import torch.distributed as dist
from torch import nn

from helpers.comm import CommLedger
from helpers.grading.checks.lab07 import common
from helpers.grading.checks.lab07.common import (
    TOL,
    WORLD_SIZE,
    _flat,
    _launch,
    _max_diff,
    _memoized,
)
from helpers.grading.registry import answer, public_check
from helpers.grading.shared_run import definitions, part_or_error
from helpers.memory import state_bytes

STEPS_7_5, LR_CHANGE_AT = 5, 2  # after LR_CHANGE_AT steps every group's lr is halved
ADAMW_DEFAULTS = {"lr": 1e-3, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 1e-2}  # torch.optim.AdamW's
HYPER = ("lr", "betas", "eps", "weight_decay")


def _model_7_5():
    """A frozen first layer (40 + 8), then 36 trainable weights and 5 trainable biases."""
    torch.manual_seed(5 + common.OFFSET)
    model = nn.Sequential(nn.Linear(5, 8), nn.Tanh(), nn.Linear(8, 4), nn.Tanh(), nn.Linear(4, 1))
    model[0].requires_grad_(False)
    return model


def _groups_7_5(model):
    """Two groups, every parameter passed: matrices (36 trainable: shards of 12) and biases (5: shards of 2, 1 zero)."""
    return [{"params": [p for p in model.parameters() if p.dim() == 2], "lr": 0.02, "weight_decay": 0.1},
            {"params": [p for p in model.parameters() if p.dim() == 1], "lr": 0.03, "weight_decay": 0.0}]


SHARDS_7_5 = [math.ceil(36 / WORLD_SIZE), math.ceil(5 / WORLD_SIZE)]  # elements per rank in each group


def _batches_7_5(rank):
    generator = torch.Generator().manual_seed(50 + rank + 10 * common.OFFSET)  # different data on every rank
    xs = [torch.randn(2, 5, generator=generator) for _ in range(STEPS_7_5)]
    return [(x, torch.sin(x.sum(dim=1, keepdim=True))) for x in xs]


def _train(model, optimizer, batches_of_step, halve=True):
    """The user's loop; after LR_CHANGE_AT steps every group's lr is halved through param_groups."""
    for step in range(STEPS_7_5):
        if halve and step == LR_CHANGE_AT:
            for group in optimizer.param_groups:
                group["lr"] *= 0.5
        x, y = batches_of_step(step)
        optimizer.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()


def _shape(ZeroAdamW, model):
    """What torch code relies on: an Optimizer, its param_groups, AdamW's defaults, the inherited zero_grad."""
    groups = _groups_7_5(model)
    optimizer = ZeroAdamW(groups, betas=(0.8, 0.99), eps=1e-7)
    tiny = nn.Linear(2, 1)
    defaults = ZeroAdamW(tiny.parameters()).param_groups[0]
    model(torch.ones(1, 5)).sum().backward()
    optimizer.zero_grad()
    return {"is_optimizer": isinstance(optimizer, torch.optim.Optimizer),
            "groups": [{"params": [id(p) for p in g["params"]], **{k: g.get(k) for k in HYPER}}
                       for g in optimizer.param_groups],
            "expected_params": [[id(p) for p in g["params"]] for g in groups],
            "defaults": {k: defaults.get(k) for k in HYPER},
            "zero_grad_left": [name for name, p in model.named_parameters() if p.grad is not None]}


def _training(ZeroAdamW, rank):
    """The user's loop on a fresh model: final parameters, collectives, bytes held, the state's step counts."""
    model = _model_7_5()
    optimizer = ZeroAdamW(_groups_7_5(model))
    batches = _batches_7_5(rank)
    with CommLedger() as ledger:
        _train(model, optimizer, lambda step: batches[step])
    steps = {str(key): value.get("step") if isinstance(value, dict) else None for key, value in optimizer.state.items()}
    return {"params": _flat(model.parameters()), "records": [r.op for r in ledger.records],
            "held": state_bytes(model, optimizer), "steps": steps}



def _train_on_rank(ZeroAdamW):
    """Runs on every rank: the optimizer's shape on one model, then the user's loop on a fresh one; rank 0 also runs
    the reference (here, not in the kernel: torch.optim's first use imports torch._dynamo, preloaded on the ranks)."""
    rank = dist.get_rank()
    reference = {"params": _one_process(), "held": _one_process(held=True)} if rank == 0 else None
    return {"shape": part_or_error(_shape, ZeroAdamW, _model_7_5()), "train": part_or_error(_training, ZeroAdamW, rank),
            "reference": reference}


def _one_process(groups_of=_groups_7_5, halve=True, held=False):
    """torch.optim.AdamW in one process on every rank's batch at once (equal sizes: the mean gradient): its
    parameters, or with held=True the bytes of its optimizer state."""
    model = _model_7_5()
    optimizer = torch.optim.AdamW(groups_of(model))
    batches = [_batches_7_5(rank) for rank in range(WORLD_SIZE)]
    _train(model, optimizer, lambda step: [torch.cat(parts) for parts in zip(*(b[step] for b in batches))], halve)
    return state_bytes(model, optimizer)["optimizer"] if held else _flat(model.parameters())


def _one_group(model):
    return [{"params": list(model.parameters())}]


# What a run that did not finish says first (the grader's hidden test says it too).
HINT = "Every rank must step the same groups, each with one reduce-scatter and one all-gather. "


def _results(ns):
    cls = answer(ns, "ZeroAdamW")
    return _memoized("7.5", definitions(ns), lambda: _launch(_train_on_rank, cls, hint=HINT))


def _diagnose(result):
    """What rank 0's wrong parameters probably came from, and the fix; or ''."""
    params, steps = result["params"], result["steps"]
    frozen = _flat(_model_7_5()[0].parameters())
    if _max_diff(params[: frozen.numel()], frozen) > 0:
        return ("the frozen first layer changed: keep only each group's parameters with requires_grad=True in its "
                "flat parameter (torch.optim.AdamW skips a parameter without a gradient)")
    if "reduce_scatter" not in result["records"]:
        return ("the ledger shows no reduce_scatter, so each rank stepped its shard with its OWN gradient (the "
                "all-gather makes the ranks identical anyway): call reduce_scatter_gradients(params) in step()")
    if not steps or any(step != STEPS_7_5 for step in steps.values()):
        return (f"self.state holds the step counts {steps} after {STEPS_7_5} steps: keep each group's adam_state in "
                "self.state, made once (at the first step) and updated in place by zero_adamw_step")
    variants = {
        "They equal AdamW with the constructor's lr and weight_decay for every group, never halved: read "
        "group['lr'], group['weight_decay'], group['betas'] and group['eps'] from self.param_groups at every step(), "
        "where each group keeps its own and an LR scheduler changes them": lambda: _one_process(_one_group, False),
        "They equal AdamW with the learning rates never halved: read group['lr'] from self.param_groups at every "
        "step(), where an LR scheduler changes it": lambda: _one_process(halve=False),
    }
    return next((name for name, run in variants.items() if _max_diff(params, run()) < 1e-5), "")


# --- 7.5 ZeroAdamW ------------------------------------------------------------------------------------------------
@public_check("7.5")
def an_optimizer_with_adamws_param_groups(ns):
    shape = _results(ns)[0]["shape"]
    assert "error" not in shape, (f"ZeroAdamW(groups, betas=(0.8, 0.99), eps=1e-7), a backward and zero_grad() "
                                  f"raised {shape.get('error')}")
    assert shape["is_optimizer"], ("ZeroAdamW(...) is not a torch.optim.Optimizer: subclass it, so that LR "
                                   "schedulers, zero_grad() and param_groups work as with torch.optim.AdamW")
    groups = shape["groups"]
    assert [g["params"] for g in groups] == shape["expected_params"], (
        f"param_groups holds {[len(g['params']) for g in groups]} parameters per group; expected every parameter "
        f"passed, frozen ones too, in its own group ({[len(p) for p in shape['expected_params']]}): call "
        "super().__init__(params, defaults), which builds param_groups as every torch optimizer does")
    expected = [{"lr": 0.02, "betas": (0.8, 0.99), "eps": 1e-7, "weight_decay": 0.1},
                {"lr": 0.03, "betas": (0.8, 0.99), "eps": 1e-7, "weight_decay": 0.0}]
    got = [{k: tuple(g[k]) if isinstance(g[k], list) else g[k] for k in HYPER} for g in groups]
    assert got == expected, (f"ZeroAdamW(groups, betas=(0.8, 0.99), eps=1e-7): param_groups' values are {got}, "
                             f"expected {expected}: each group keeps its own lr and weight_decay, the constructor's "
                             "arguments fill in the rest (pass them to super().__init__ as the defaults)")
    defaults = {k: tuple(v) if isinstance(v, list) else v for k, v in shape["defaults"].items()}
    assert defaults == ADAMW_DEFAULTS, (f"ZeroAdamW(params) has {defaults}; torch.optim.AdamW's defaults are "
                                        f"{ADAMW_DEFAULTS}: use the same defaults")
    assert not shape["zero_grad_left"], (f"after zero_grad() {shape['zero_grad_left']} still have a .grad: inherit "
                                         "torch.optim.Optimizer's zero_grad")


@public_check("7.5")
def equals_torch_adamw_in_one_process(ns):
    results = [result["train"] for result in _results(ns)]
    error = results[0].get("error")
    assert not error, (f"the loop (zero_grad, forward, backward, step; the lr halved through param_groups after "
                       f"{LR_CHANGE_AT} steps) raised {error}")
    ours = results[0]["params"]
    for rank in range(1, WORLD_SIZE):
        diff = _max_diff(results[rank]["params"], ours)
        assert diff == 0, (f"after {STEPS_7_5} steps on different data, rank {rank}'s parameters differ from rank 0's "
                           f"by {diff:.3g}: step() must step every shard with the MEAN gradient "
                           "(reduce_scatter_gradients) and all-gather the parameters (zero_adamw_step)")
    diff = _max_diff(ours, _results(ns)[0]["reference"]["params"])
    assert diff < TOL, (f"after {STEPS_7_5} steps (the lr halved after {LR_CHANGE_AT}), max |parameters - "
                        f"torch.optim.AdamW's in one process on all the ranks' batches| = {diff:.3g} (tolerance "
                        f"{TOL:g}). " + (_diagnose(results[0]) or
                                         "Check: each group's trainable parameters, its own state, its current "
                                         "lr, betas, eps and weight_decay"))


@public_check("7.5")
def state_is_one_nth(ns):
    expected, adamw = 8 * sum(SHARDS_7_5), _results(ns)[0]["reference"]["held"]
    for rank, result in enumerate(_results(ns)):
        assert "error" not in result["train"], f"the training loop raised {result['train']['error']}"
        held = result["train"]["held"]
        assert held["optimizer"] == expected, (
            f"rank {rank}: state_bytes(model, optimizer) counts {held['optimizer']} bytes of optimizer state; "
            f"expected exp_avg + exp_avg_sq of this rank's shard of each group only: 2 x 4 x "
            f"({' + '.join(map(str, SHARDS_7_5))}) = {expected} bytes (torch.optim.AdamW holds "
            f"{adamw}). Keep the state in self.state, one adam_state per group")
        assert held["grads"] == 0, (f"rank {rank} still holds {held['grads']} bytes of gradients after step(): "
                                    "ZeRO-2 frees them (reduce_scatter_gradients)")


@public_check("7.5")
def reduce_scatter_and_all_gather_only(ns):
    per_step = ["reduce_scatter", "all_gather"] * len(SHARDS_7_5)
    for rank, result in enumerate(_results(ns)):
        assert "error" not in result["train"], f"the training loop raised {result['train']['error']}"
        ops = result["train"]["records"]
        assert set(ops) <= {"reduce_scatter", "all_gather"}, (
            f"rank {rank}: the ledger shows {sorted(set(ops))} during training; ZeRO-2 uses reduce_scatter "
            "(gradients) and all_gather (parameters) only")
        assert ops == per_step * STEPS_7_5, (
            f"rank {rank}: {ops.count('reduce_scatter')} reduce_scatter and {ops.count('all_gather')} all_gather in "
            f"{STEPS_7_5} steps with {len(SHARDS_7_5)} groups; expected one of each per group per step, in that "
            "order")
