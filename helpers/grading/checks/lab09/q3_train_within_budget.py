"""Checks of lab 9.3: train_within_budget's strategy, its measured bytes, and parameters equal to torch DDP's."""
import torch
import torch.distributed as dist
import torch.nn.functional as F

from helpers import theory
from helpers.grading.checks.lab09.common import (
    FP32_ADAM,
    LR,
    OPS,
    STEPS,
    TOL,
    Layer,
    make_net,
    num_params,
    padded_num_params,
    rank_batches,
    run_on_ranks,
)
from helpers.grading.registry import answer, public_check


# ------------------------------------------------------------------------------------------------ question 9.3
def _on_ranks_train(train_within_budget, budget):
    """The student's training, then torch DDP with Adam on the same batches, for comparison."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    batches = rank_batches(dist.get_rank())
    result = train_within_budget(make_net, batches, budget, lr=LR, block_types=(Layer,))
    model = DDP(make_net())
    optimizer = torch.optim.Adam(model.parameters(), lr=LR)
    for x, y in batches:
        optimizer.zero_grad(set_to_none=True)
        F.mse_loss(model(x), y).backward()
        optimizer.step()
    return result, [p.detach().clone() for p in model.parameters()]


def _check_training(results, world_size, budget, expected, default):
    """expected: choose_strategy's choice with FP32_ADAM, default: with 2 + 2 + 12 bytes (recorded by the caller)."""
    model = make_net()
    psi, tensors = num_params(model), len(list(model.parameters()))
    where = f"{world_size} ranks, budget {budget} bytes (Ψ = {psi} parameters, fp32 Adam: 16 bytes each under DDP)"
    first = results[0][0]
    assert isinstance(first, dict) and {"strategy", "state_bytes", "comm", "params"} <= set(first), (
        f"{where}: return a dict with keys 'strategy', 'state_bytes', 'comm', 'params'; got {type(first).__name__}")
    assert first["strategy"] == expected, (
        f"{where}: expected strategy {expected!r} (choose_strategy with k=8, param_bytes=4, grad_bytes=4), "
        f"got {first['strategy']!r}" + (": the choice for the default 2 + 2 + 12 bytes; pass **FP32_ADAM to "
                                        "choose_strategy" if first["strategy"] == default != expected else ""))
    shards = 1 if expected == "no_shard" else world_size
    psi_padded = padded_num_params(model, shards)
    low = theory.strategy_memory(psi, world_size, expected, **FP32_ADAM)
    high = theory.strategy_memory(psi_padded, world_size, expected, **FP32_ADAM)
    measured = first["state_bytes"]
    for rank, (result, _) in enumerate(results):
        total = result["state_bytes"]["total"]
        assert total <= budget, f"{where}: rank {rank} held {total} bytes of model state, over the budget"
    for category in ("params", "grads", "optimizer"):
        slack = 4 * tensors if category == "optimizer" else 0  # Adam's step counters: one 4-byte tensor each
        assert low[category] <= measured[category] <= high[category] + slack, (
            f"{where}: rank 0's largest '{category}' bytes were {measured[category]}; helpers.theory gives "
            f"{low[category]:.0f} ({high[category] + slack:.0f} with padding). Measure state_bytes(model, optimizer) "
            "after forward, after backward AND after the step of the first step, and keep each category's maximum "
            "(for shard_grad_op the parameters are whole only between forward and backward)")
    assert measured["total"] == measured["params"] + measured["grads"] + measured["optimizer"], (
        f"{where}: state_bytes['total'] must be the sum of the three maxima, got {measured}")
    predicted = theory.comm_breakdown(expected, psi_padded, world_size, bytes_per_element=4, kind="payload")
    for op in OPS:
        got = first["comm"].get(op, {}).get("payload_bytes", 0)
        assert got == predicted[op], (
            f"{where}: the first step's {op} payload was {got} bytes, helpers.theory predicts {predicted[op]:.0f} "
            f"for {expected} (padded Ψ = {psi_padded}). Record the ledger around forward and backward of step 1")
    reference = results[0][1]
    for rank, (result, _) in enumerate(results):
        params = result["params"]
        assert len(params) == len(reference) and all(p.shape == q.shape for p, q in zip(params, reference)), (
            f"{where}: rank {rank} returned parameters of shapes {[tuple(p.shape) for p in params]}; return the FULL "
            "parameters (DTensor.full_tensor()), in model.parameters() order")
        assert all(torch.equal(p, q) for p, q in zip(params, results[0][0]["params"])), (
            f"{where}: rank {rank}'s parameters differ from rank 0's: every rank must end with the same model")
        error = max((p - q).abs().max().item() for p, q in zip(params, reference))
        assert error <= TOL, (
            f"{where}: after {STEPS} Adam steps, max |parameters - torch DDP's| = {error:.2e} "
            f"(tolerance {TOL:.0e}): the gradients were not averaged like DDP's, "
            "or the step order differs (forward, backward, step, zero_grad)")


@public_check("9.3")
def fsdp_within_budget_on_3_ranks(ns):
    train = answer(ns, "train_within_budget")
    # fp32 Adam on 3 ranks: ZeRO-2 needs 4 + 12 / 3 = 8 Ψ, FSDP 16 / 3 Ψ (+ padding). With the 2 + 2 + 12 convention
    # ZeRO-2 would need 6.7 Ψ and fit: this budget also tells whether the fp32 bytes were used.
    budget = int(7.5 * num_params(make_net()))
    _check_training(run_on_ranks(_on_ranks_train, 3, (train, budget), "train_within_budget"), 3, budget,
                    expected="full_shard", default="shard_grad_op")


@public_check("9.3")
def zero2_within_budget_on_2_ranks(ns):
    train = answer(ns, "train_within_budget")
    budget = 12 * num_params(make_net())  # DDP needs 16 Ψ, ZeRO-2 on 2 ranks 4 Ψ + 12 Ψ / 2 = 10 Ψ
    _check_training(run_on_ranks(_on_ranks_train, 2, (train, budget), "train_within_budget"), 2, budget,
                    expected="shard_grad_op", default="shard_grad_op")
