"""Checks of lab 7.4: train_zero2 equals torch DDP + AdamW and holds 1/N of the optimizer state."""
import math

import torch
import torch.distributed as dist
import torch.nn as nn

from helpers.comm import CommLedger
from helpers.grading.checks.lab07 import common
from helpers.grading.checks.lab07.common import TOL, WORLD_SIZE, _flat, _launch, _max_diff, _memoized
from helpers.grading.registry import answer, public_check
from helpers.grading.shared_run import definitions
from helpers.memory import state_bytes

# --- 7.4 train_zero2 ----------------------------------------------------------------------------

STEPS_7_4, LR_7_4, WD_7_4 = 4, 0.02, 0.01


def _model_7_4():
    """A frozen first layer (48 parameters), then 41 trainable ones: shards of 14 on 3 ranks, 1 padding zero."""
    torch.manual_seed(4 + common.OFFSET)
    model = nn.Sequential(nn.Linear(5, 8), nn.Tanh(), nn.Linear(8, 4), nn.Tanh(), nn.Linear(4, 1))
    model[0].requires_grad_(False)
    return model


TRAINABLE_7_4 = 8 * 4 + 4 + 4 + 1


def _batches_7_4(rank):
    """This rank's own batches: different data on every rank."""
    generator = torch.Generator().manual_seed(40 + rank + 10 * common.OFFSET)
    out = []
    for _ in range(STEPS_7_4):
        x = torch.randn(3, 5, generator=generator)
        out.append((x, torch.sin(x.sum(dim=1, keepdim=True))))
    return out


def _train_on_rank(train):
    """Runs on every rank: the student's ZeRO-2 training, then torch DDP + AdamW on the same batches."""
    from torch.nn.parallel import DistributedDataParallel

    batches = _batches_7_4(dist.get_rank())
    model = _model_7_4()
    with CommLedger() as ledger:
        state = train(model, batches, lr=LR_7_4, weight_decay=WD_7_4)
    held = None
    if isinstance(state, dict) and all(isinstance(state.get(k), torch.Tensor) for k in ("exp_avg", "exp_avg_sq")):
        held = state_bytes(model, extra={"optimizer": [state["exp_avg"], state["exp_avg_sq"]]})
    frozen_grads = [p.grad is not None for p in model[0].parameters()]
    zero = {"params": _flat(model.parameters()), "records": [(r.op, r.wire_bytes) for r in ledger.records],
            "held": held, "frozen_grads": any(frozen_grads),
            "step": state.get("step") if isinstance(state, dict) else None}

    reference = DistributedDataParallel(_model_7_4())
    optimizer = torch.optim.AdamW([p for p in reference.parameters() if p.requires_grad], lr=LR_7_4,
                                  weight_decay=WD_7_4)
    with CommLedger() as ddp_ledger:
        for x, y in batches:
            optimizer.zero_grad()
            nn.functional.mse_loss(reference(x), y).backward()
            optimizer.step()
    ddp = {"params": _flat(reference.module.parameters()),
           "all_reduce_wire": [r.wire_bytes for r in ddp_ledger.records if r.op == "all_reduce"],
           "held": state_bytes(reference.module, optimizer)}
    return zero, ddp


# What a run that did not finish says first (the grader's hidden test says it too).
HINT = "Every rank must run the same number of steps, each with one reduce-scatter and one all-gather. "


def _training_results(ns):
    train = answer(ns, "train_zero2")
    return _memoized("7.4", definitions(ns), lambda: _launch(_train_on_rank, train, hint=HINT))


@public_check("7.4")
def identical_on_every_rank_despite_different_data(ns):
    results = _training_results(ns)
    for rank in range(1, WORLD_SIZE):
        diff = _max_diff(results[rank][0]["params"], results[0][0]["params"])
        assert diff == 0, (f"after {STEPS_7_4} steps on different data, rank {rank}'s parameters differ from rank 0's "
                           f"by {diff:.3g}: every rank must update its shard with the MEAN gradient's shard "
                           "(reduce_scatter_gradients) and then copy the all-gathered parameters")


@public_check("7.4")
def equals_torch_ddp_adamw(ns):
    results = _training_results(ns)
    zero, ddp = results[0]
    diff = _max_diff(zero["params"], ddp["params"])
    assert diff < TOL, (f"after {STEPS_7_4} steps rank 0's parameters differ from torch DDP + AdamW's (same start, "
                        f"same batches) by {diff:.3g} (tolerance {TOL:g}); " + (_diagnose(zero) or (
                            "check: the mean MSE loss of the local batch, one reduce_scatter_gradients and one "
                            "zero_adamw_step per batch, the same state across steps, lr and weight_decay passed on")))


def _one_process(weight_decay):
    """One process, AdamW over the trainable parameters on the ranks' batches together (equal sizes: DDP's mean)."""
    model = _model_7_4()
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=LR_7_4,
                                  weight_decay=weight_decay)
    batches = [_batches_7_4(rank) for rank in range(WORLD_SIZE)]
    for step in range(STEPS_7_4):
        x, y = (torch.cat(parts) for parts in zip(*(b[step] for b in batches)))
        optimizer.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()
    return _flat(model.parameters())


def _diagnose(zero):
    """The likely cause of rank 0's wrong parameters, and the fix; or ''."""
    frozen = _flat(_model_7_4()[0].parameters())
    if _max_diff(zero["params"][: frozen.numel()], frozen) > 0 or zero["frozen_grads"]:
        return ("the frozen first layer changed too: it is in your flat parameter. Keep only the parameters with "
                "requires_grad=True, as AdamW over the trainable parameters does")
    if "reduce_scatter" not in [op for op, _ in zero["records"]]:
        return ("the ledger shows no reduce_scatter, so each rank stepped its shard with its OWN gradient (the "
                "all-gather makes the ranks identical anyway); call reduce_scatter_gradients(params) after backward")
    if zero["step"] is not None and zero["step"] != STEPS_7_4:
        return (f"the returned state['step'] is {zero['step']} after {STEPS_7_4} steps: the state was made anew "
                "(from zeros) during training; make it with adam_state once, before the loop")
    if _max_diff(zero["params"], _one_process(weight_decay=0.0)) < 1e-5:
        return (f"they equal AdamW without weight decay; pass weight_decay=weight_decay ({WD_7_4} here) on to "
                "zero_adamw_step")
    return ""


@public_check("7.4")
def frozen_parameters_untouched(ns):
    results = _training_results(ns)
    frozen = _flat(_model_7_4()[0].parameters())
    for rank, (zero, _) in enumerate(results):
        diff = _max_diff(zero["params"][: frozen.numel()], frozen)
        assert diff == 0 and not zero["frozen_grads"], (
            f"rank {rank}: the frozen first layer (requires_grad=False) changed by {diff:.3g} or got a .grad: keep "
            "only the parameters with requires_grad=True in the flat parameter (weight decay would shrink the "
            "frozen ones, and their state would waste memory)")


@public_check("7.4")
def wire_bytes_equal_ddp_padding_aside(ns):
    results = _training_results(ns)
    pad = -TRAINABLE_7_4 % WORLD_SIZE
    padding_share = 2 * (WORLD_SIZE - 1) / WORLD_SIZE * 4 * pad  # bytes a rank sends for the padding, per step
    for rank, (zero, ddp) in enumerate(results):
        ops = sorted({op for op, _ in zero["records"]})
        assert ops == ["all_gather", "reduce_scatter"], (
            f"rank {rank}: the ledger shows collectives {ops} during training; ZeRO-2 uses only reduce_scatter "
            "(gradients) and all_gather (parameters)")
        calls = [op for op, _ in zero["records"]]
        assert calls == ["reduce_scatter", "all_gather"] * STEPS_7_4, (
            f"rank {rank}: {calls.count('reduce_scatter')} reduce_scatter and {calls.count('all_gather')} all_gather "
            f"calls in {STEPS_7_4} steps; expected one of each per step, in that order")
        zero_wire = sum(w for _, w in zero["records"]) / STEPS_7_4
        ddp_wire = sum(ddp["all_reduce_wire"]) / len(ddp["all_reduce_wire"])
        # one byte per call of slack: the ledger rounds each call's wire bytes down to a whole byte
        assert abs(zero_wire - (ddp_wire + padding_share)) <= 2, (
            f"rank {rank}: {zero_wire:.0f} wire bytes per step; DDP's all-reduce sends {ddp_wire:.0f}, and the "
            f"reduce-scatter + all-gather of ZeRO should send that plus 2 (N-1)/N x 4 x {pad} padding element(s) "
            f"= {padding_share:.1f} bytes")


@public_check("7.4")
def optimizer_state_is_one_nth(ns):
    results = _training_results(ns)
    size = math.ceil(TRAINABLE_7_4 / WORLD_SIZE)
    for rank, (zero, ddp) in enumerate(results):
        assert zero["held"] is not None, (
            f"rank {rank}: train_zero2 should return its state dict (with 'exp_avg' and 'exp_avg_sq' tensors)")
        got, full = zero["held"]["optimizer"], ddp["held"]["optimizer"]
        assert got == 8 * size, (
            f"rank {rank} holds {got} bytes of optimizer state; expected exp_avg + exp_avg_sq of its shard only: "
            f"2 x 4 x {size} = {8 * size} bytes, about 1/{WORLD_SIZE} of DDP + AdamW's {full}")
