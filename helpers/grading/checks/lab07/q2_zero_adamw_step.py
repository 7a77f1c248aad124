"""Checks of lab 7.2: zero_adamw_step steps this rank's shard as torch AdamW would, then one all-gather."""
import math

import torch
import torch.distributed as dist
import torch.nn as nn

from helpers.comm import CommLedger
from helpers.grading.checks.lab07 import common
from helpers.grading.checks.lab07.common import (
    TOL,
    WORLD_SIZE,
    _flat,
    _max_diff,
    _ops,
    _padded_shard,
    _shared_launch,
)
from helpers.grading.registry import answer, public_check
from helpers.grading.shared_run import definitions

# --- 7.2 zero_adamw_step ------------------------------------------------------------------------

STEPS_7_2 = 3
# name -> (parameter shapes, lr, weight_decay). "model": 34 elements, shards of 12, 2 padding zeros on rank 2.
# "tiny": 4 elements, shards of 2: rank 2 holds only padding. weight_decay=0 is torch.optim.Adam.
CASES_7_2 = {"model": ([(4, 5), (4,), (2, 4), (2,)], 0.05, 0.1), "tiny": ([(3,), (1,)], 0.1, 0.0)}


def _params_7_2(shapes):
    generator = torch.Generator().manual_seed(7 + common.OFFSET)
    return [nn.Parameter(0.5 * torch.randn(shape, generator=generator)) for shape in shapes]


def _mean_gradient_7_2(numel, step):
    """The mean gradient of step `step`: the same on every rank (as after averaging)."""
    return torch.randn(numel, generator=torch.Generator().manual_seed(100 + step + 10 * common.OFFSET))


def _step_on_rank(step_fn):
    """Runs on every rank: the student's step, STEPS_7_2 times per case, on this rank's shard of known gradients."""
    rank, world_size = dist.get_rank(), dist.get_world_size()
    out = {}
    for case, (shapes, lr, weight_decay) in CASES_7_2.items():
        params = _params_7_2(shapes)
        numel = sum(p.numel() for p in params)
        size = math.ceil(numel / world_size)
        state = {"step": 0, "exp_avg": torch.zeros(size), "exp_avg_sq": torch.zeros(size)}
        objects = [id(p) for p in params]
        history, records = [], []
        for step in range(STEPS_7_2):
            grad_shard = _padded_shard(_mean_gradient_7_2(numel, step), rank, world_size).clone()
            with CommLedger() as ledger:
                step_fn(params, grad_shard, state, lr=lr, weight_decay=weight_decay)
            history.append(_flat(params).clone())
            records.append(_ops(ledger.records))
        in_place = [id(p) for p in params] == objects and all(p.is_leaf and p.requires_grad for p in params)
        out[case] = {"history": history, "records": records, "in_place": in_place, "step": state.get("step"),
                     "exp_avg": state.get("exp_avg"), "exp_avg_sq": state.get("exp_avg_sq")}
    return out


def _reference_7_2(case):
    """One process, torch.optim.AdamW on the whole parameters: parameters after each step, final state (flat)."""
    shapes, lr, weight_decay = CASES_7_2[case]
    params = _params_7_2(shapes)
    optimizer = torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay)
    numel, history = sum(p.numel() for p in params), []
    for step in range(STEPS_7_2):
        offset, grad = 0, _mean_gradient_7_2(numel, step)
        for p in params:
            p.grad = grad[offset : offset + p.numel()].view_as(p).clone()
            offset += p.numel()
        optimizer.step()
        history.append(_flat(params).clone())
    state = {key: _flat([optimizer.state[p][key] for p in params]) for key in ("exp_avg", "exp_avg_sq")}
    return history, state


# Wrong updates a student's parameters may equal, each with its fix: (name, keyword arguments of _variant).
_VARIANTS = (
    ("torch.optim.Adam with an L2 penalty added to the gradient (g + weight_decay * p); AdamW decays the parameter "
     "itself: p *= 1 - lr * weight_decay, before the Adam update, and the gradient stays as it is", {"decay": "l2"}),
    ("AdamW with the weight decay without the learning rate (p *= 1 - weight_decay); torch scales it by lr: "
     "p *= 1 - lr * weight_decay", {"decay": "no_lr"}),
    ("Adam without the bias corrections; divide by 1 - beta1**t and 1 - beta2**t, with t = state['step'] after "
     "the increment (1 in the first call)", {"bias_correction": False}),
    ("AdamW whose moments start from zero in every call (a new optimizer or new tensors each step, t = 1 each "
     "time); update state['exp_avg'] and state['exp_avg_sq'] in place and increment state['step']",
     {"fresh_state": True}),
)


def _variant(case, *, decay="decoupled", bias_correction=True, fresh_state=False, betas=(0.9, 0.999), eps=1e-8):
    """Parameters after each step of a (possibly wrong) AdamW on the whole flat parameter, in float64."""
    shapes, lr, weight_decay = CASES_7_2[case]
    p = _flat(_params_7_2(shapes)).double()
    m, v, history = torch.zeros_like(p), torch.zeros_like(p), []
    for step in range(STEPS_7_2):
        g = _mean_gradient_7_2(p.numel(), step).double()
        if fresh_state:
            m, v = torch.zeros_like(p), torch.zeros_like(p)
        t = 1 if fresh_state else step + 1
        if decay == "l2":
            g = g + weight_decay * p
        elif decay == "no_lr":
            p = p * (1 - weight_decay)
        else:
            p = p * (1 - lr * weight_decay)
        m = betas[0] * m + (1 - betas[0]) * g
        v = betas[1] * v + (1 - betas[1]) * g * g
        c1, c2 = (1 - betas[0] ** t, 1 - betas[1] ** t) if bias_correction else (1, 1)
        p = p - lr * (m / c1) / ((v / c2).sqrt() + eps)
        history.append(p.float())
    return history


_CHECKLIST = (" Check: the state's step counts from 1 (bias corrections 1 - beta**step); weight decay is decoupled "
              "(p *= 1 - lr * weight_decay, before the Adam update, not added to the gradient); the updated shard "
              "of every rank lands at offset rank * shard size of the gathered flat parameter")


def _diagnose(history, case):
    """' They equal <a wrong update>; <the fix>' when a step's parameters match one, or ''."""
    for name, kwargs in _VARIANTS:
        if all(_max_diff(got, ref) < 1e-5 for got, ref in zip(history, _variant(case, **kwargs))):
            return f" They equal {name}."
    return ""


# What a run that did not finish says first, and torch's error of an unpadded shard with what it means (the grader's
# hidden test says them too).
HINT = "Every rank must call exactly one dist.all_gather_single per step, with equal-sized shards. "
# the shard and the state (or the gathered buffer) differ in size: the shard lacks its padding
SIZE_ERROR = "must match the size of tensor"
UNPADDED = ("a shard and the state have different sizes: the shard is not padded. Append this rank's `pad` zeros "
            "(shard_range) so that every shard, and every rank's input to dist.all_gather_single, has "
            "s = ceil(numel / world_size) elements. ")


def _step_results(ns):
    fn = answer(ns, "zero_adamw_step")
    return _shared_launch("7.2", definitions(ns), fn, _step_on_rank, HINT, SIZE_ERROR, UNPADDED)


@public_check("7.2")
def parameters_equal_torch_adamw(ns):
    results = _step_results(ns)
    for case, (shapes, lr, weight_decay) in CASES_7_2.items():
        expected, _ = _reference_7_2(case)
        for step in range(STEPS_7_2):
            diff = _max_diff(results[0][case]["history"][step], expected[step])
            assert diff < TOL, (
                f"{sum(math.prod(s) for s in shapes)} parameters, lr={lr}, weight_decay={weight_decay}: after step "
                f"{step + 1} rank 0's parameters differ from torch.optim.AdamW's by {diff:.3g} (tolerance {TOL:g})."
                + (_diagnose(results[0][case]["history"], case) or _CHECKLIST))


@public_check("7.2")
def identical_on_every_rank(ns):
    results = _step_results(ns)
    for case in CASES_7_2:
        for rank in range(1, WORLD_SIZE):
            diff = _max_diff(results[rank][case]["history"][-1], results[0][case]["history"][-1])
            assert diff == 0, (f"case {case!r}: rank {rank}'s parameters differ from rank 0's by {diff:.3g}; after "
                               "the all-gather every rank must copy the same gathered flat parameter into its tensors")


@public_check("7.2")
def state_is_this_rank_shard_only(ns):
    results = _step_results(ns)
    for case, (shapes, _, _) in CASES_7_2.items():
        _, expected = _reference_7_2(case)
        numel = sum(math.prod(s) for s in shapes)
        size = math.ceil(numel / WORLD_SIZE)
        for rank, result in enumerate(results):
            got = result[case]
            assert got["step"] == STEPS_7_2, (f"case {case!r}, rank {rank}: state['step'] is {got['step']!r} after "
                                              f"{STEPS_7_2} calls; increment it once per call (it starts at 0)")
            for key in ("exp_avg", "exp_avg_sq"):
                tensor = got[key]
                assert isinstance(tensor, torch.Tensor) and tensor.shape == (size,) and tensor.dtype == torch.float32, (
                    f"case {case!r}, rank {rank}: state[{key!r}] should be a float32 tensor of {size} elements "
                    f"(this rank's shard of {numel} padded to a multiple of {WORLD_SIZE}); got "
                    f"{getattr(tensor, 'dtype', type(tensor).__name__)} {tuple(getattr(tensor, 'shape', ()))}")
                reference = _padded_shard(expected[key], rank, WORLD_SIZE)
                diff = _max_diff(tensor, reference)
                assert diff < TOL, (
                    f"case {case!r}, rank {rank}: state[{key!r}] differs from torch.optim.AdamW's {key} for this "
                    f"rank's shard by {diff:.3g}. Keep Adam's moments in state (updated in place every call); "
                    "an optimizer created inside the function starts from zeros every call")


@public_check("7.2")
def one_all_gather_per_step(ns):
    results = _step_results(ns)
    for case, (shapes, _, _) in CASES_7_2.items():
        padded = math.ceil(sum(math.prod(s) for s in shapes) / WORLD_SIZE) * WORLD_SIZE
        expected = [("all_gather", 4 * padded)]
        for rank, result in enumerate(results):
            for step, ops in enumerate(result[case]["records"]):
                assert ops == expected, (
                    f"case {case!r}, rank {rank}, step {step + 1}: the ledger shows {ops}; expected exactly one "
                    f"all_gather of the padded flat parameter ({padded} float32 = {4 * padded} bytes): each rank "
                    "updates its own shard and dist.all_gather_single collects them. (An all_reduce or a broadcast "
                    "per rank sends more; parameters are not averaged in ZeRO)")


@public_check("7.2")
def parameters_updated_in_place(ns):
    for rank, result in enumerate(_step_results(ns)):
        for case in CASES_7_2:
            assert result[case]["in_place"], (
                f"case {case!r}, rank {rank}: the parameters must stay the same tensor objects, trainable leaves "
                "(an optimizer or a model holding them must see the update): copy the gathered values into them "
                "under torch.no_grad() (p.copy_(...)); do not replace them in the list")
