"""Checks of lab 12.2: zero2_scaled_step, ZeRO-2 with a loss scaler, where every rank sees only its shard of the
gradient and must still skip together.

Three ranks train the same model on different data for a few steps; on some steps rank 0's local gradient holds one
inf, at an element that the reduce-scatter delivers to ANOTHER rank's shard only. The run is repeated with the same
harness and torch.distributed.fsdp.sharded_grad_scaler.ShardedGradScaler, whose unscale_ all-reduces found_inf (a SUM
of 0/1 flags, tested as "any"), as the reference: every rank must skip those steps, keep ShardedGradScaler's scale,
and end with its parameters.
"""
import math

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

from helpers.comm import CommLedger
from helpers.grading.checks.lab12 import common
from helpers.grading.checks.lab12.common import TOL, flat, max_diff, record_scales
from helpers.grading.registry import answer, public_check
from helpers.grading.shared_run import definitions

STEPS, LR, INIT_SCALE, INTERVAL = 6, 0.1, 2.0**8, 2


def _model():
    torch.manual_seed(22 + common.OFFSET)  # the same start on every rank
    return nn.Sequential(nn.Linear(4, 5), nn.Tanh(), nn.Linear(5, 2))  # 37 parameters: shards of 13, 2 padding


def injections():
    """{step: rank whose shard gets rank 0's inf}: two steps, never rank 0's own shard."""
    first = 1 + common.OFFSET % 2
    return {first: 2 - common.OFFSET % 2, first + 3: 1 + common.OFFSET % 2}


def _inject(params, index):
    """Set element `index` of the flat gradient to inf."""
    offset = 0
    for p in params:
        if offset <= index < offset + p.numel():
            p.grad.view(-1)[index - offset] = float("inf")
        offset += p.numel()


def _reduce_scatter_mean(params):
    """The reference's reduce-scatter: this rank's shard of the mean gradient (chapter 07); frees the .grad."""
    world_size = dist.get_world_size()
    grads = torch.cat([p.grad.reshape(-1) for p in params])
    size = math.ceil(grads.numel() / world_size)
    grads = torch.cat([grads, grads.new_zeros(world_size * size - grads.numel())])
    shard = grads.new_empty(size)
    dist.reduce_scatter_single(shard, grads)
    for p in params:
        p.grad = None
    return shard.div_(world_size)


def _all_gather_into(params, shard):
    gathered = shard.new_empty(dist.get_world_size() * shard.numel())
    dist.all_gather_single(gathered, shard.detach())
    with torch.no_grad():
        offset = 0
        for p in params:
            p.copy_(gathered[offset : offset + p.numel()].view_as(p))
            offset += p.numel()


def _reference_step(params, shard, optimizer, scaler):
    """ZeRO-2's step with ShardedGradScaler: its step() unscales the shard and all-reduces found_inf."""
    shard.grad = _reduce_scatter_mean(params)
    scaler.step(optimizer)
    _all_gather_into(params, shard)
    scaler.update()


def _train(step, scaler):
    """STEPS steps of ZeRO-2 with `step` on this rank: scales used, skipped steps, final parameters, collectives."""
    rank, world_size = dist.get_rank(), dist.get_world_size()
    model = _model()
    params = list(model.parameters())
    size = math.ceil(sum(p.numel() for p in params) / world_size)
    padded = torch.cat([flat(params), torch.zeros(world_size * size - flat(params).numel())])
    shard = nn.Parameter(padded[rank * size : (rank + 1) * size].clone())
    optimizer = torch.optim.SGD([shard], lr=LR)
    used, skipped, ops = record_scales(scaler), [], []
    g = torch.Generator().manual_seed(220 + rank + 10 * common.OFFSET)
    for t in range(STEPS):
        scaler.scale(model(torch.randn(3, 4, generator=g)).square().mean()).backward()
        if rank == 0 and t in injections():
            _inject(params, injections()[t] * size + 3 + common.OFFSET % 7)
        before = shard.detach().clone()
        with CommLedger() as ledger:
            step(params, shard, optimizer, scaler)
        skipped.append(torch.equal(before, shard.detach()))
        ops.append([(r.op, r.payload_bytes) for r in ledger.records])
    return {"used": used, "skipped": skipped, "params": flat(params), "ops": ops}


def _on_rank(step_fn, scaler_cls):
    """Runs on every rank: the student's step with the LossScaler given, then the reference with ShardedGradScaler."""
    mine = _train(step_fn, scaler_cls(INIT_SCALE, growth_interval=INTERVAL))
    theirs = _train(_reference_step, ShardedGradScaler("cpu", init_scale=INIT_SCALE, growth_interval=INTERVAL))
    return {"mine": mine, "torch": theirs}


HINT = ("every rank must issue the same collectives in the same order, on every step, skipped or not: the "
        "reduce-scatter, one all-reduce of the found_inf flag, the all-gather. ")


def _results(ns):
    step, cls = answer(ns, "zero2_scaled_step"), answer(ns, "LossScaler")
    return common._memoized("12.2", definitions(ns), lambda: common._launch(_on_rank, step, cls, hint=HINT))


def _ranks(ranks):
    return ", ".join(str(r) for r in ranks)


@public_check("12.2")
def every_rank_skips_together(ns):
    results = _results(ns)
    for t in range(STEPS):
        mine = [r["mine"]["skipped"][t] for r in results]
        theirs = results[0]["torch"]["skipped"][t]
        if len(set(mine)) > 1:
            raise AssertionError(
                f"step {t}: rank(s) {_ranks(r for r, s in enumerate(mine) if s)} skipped and rank(s) "
                f"{_ranks(r for r, s in enumerate(mine) if not s)} stepped: found_inf is only this rank's shard's; "
                "all-reduce it (one number, ReduceOp.MAX) before step(), so that every rank skips together, as "
                "ShardedGradScaler.unscale_ does")
        if mine[0] != theirs:
            where = injections().get(t)
            raise AssertionError(
                f"step {t}: no rank skipped, although rank {where}'s shard of the gradient holds an inf: skip when ANY "
                "rank found one: all-reduce the flag with MAX (or SUM, then test > 0), not MIN or a mean tested "
                "against 1" if where is not None and not mine[0] else
                f"step {t}: every rank {'skipped' if mine[0] else 'stepped'}, ShardedGradScaler's ranks "
                f"{'skipped' if theirs else 'stepped'}: unscale this rank's shard with scaler.unscale_(optimizer) "
                "once, all-reduce found_inf, then scaler.step(optimizer) and scaler.update()")


@public_check("12.2")
def one_flag_all_reduced_per_step(ns):
    """The ledger per step: the reduce-scatter, ONE all-reduce of one number (the flag), the all-gather."""
    for rank, result in enumerate(_results(ns)):
        for t, ops in enumerate(result["mine"]["ops"]):
            reduces = [nbytes for op, nbytes in ops if op == "all_reduce"]
            assert reduces, (f"rank {rank}, step {t}: no all-reduce: found_inf is never shared; all-reduce it (one "
                             f"number, MAX) after unscale_. The ledger shows {ops}")
            assert len(reduces) == 1 and reduces[0] <= 8, (
                f"rank {rank}, step {t}: all-reduces of {reduces} bytes; all-reduce only the flag, once: one number "
                "(4 bytes as float32), never the gradients (the reduce-scatter already gave each rank its shard)")
            others = [op for op, _ in ops if op not in ("all_reduce", "all_gather")]
            assert others == ["reduce_scatter"], (f"rank {rank}, step {t}: the ledger shows {ops}; expected one "
                                                  "reduce_scatter, one all_reduce of the flag and the all_gather")


@public_check("12.2")
def scales_equal_sharded_grad_scalers(ns):
    for rank, result in enumerate(_results(ns)):
        mine, theirs = result["mine"]["used"], result["torch"]["used"]
        assert list(mine) == list(theirs), (
            f"rank {rank} used the scales {list(mine)}, ShardedGradScaler {list(theirs)}: call scaler.update() "
            "once per step, after step(), with found_inf the same on every rank")


@public_check("12.2")
def parameters_identical_and_equal_to_torch(ns):
    results = _results(ns)
    for rank, result in enumerate(results):
        diff = max_diff(result["mine"]["params"], results[0]["mine"]["params"])
        assert diff == 0, (f"rank {rank}'s parameters differ from rank 0's by {diff:.3g}: all-gather every rank's "
                           "shard into the parameters on every step (all_gather_into)")
    diff = max_diff(results[0]["mine"]["params"], results[0]["torch"]["params"])
    assert diff < TOL, (
        f"the parameters are identical on every rank (the all-gather makes them so) but differ from "
        f"ShardedGradScaler's by {diff:.3g}: some shards were updated on a step that others skipped, or a shard's "
        "gradient was not unscaled exactly once")
