"""Checks of lab 12.2: zero2_scaled_step, ZeRO-2 with a loss scaler, where every rank sees only the gradients of the
parameters it owns and must still skip together.

Three ranks train the same model on different data for a few steps; each parameter tensor is owned by one rank
(round robin), its gradient is reduced to that rank only, and each rank's optimizer steps only what it owns. On some
steps rank 0's local gradient holds one inf, in a parameter ANOTHER rank owns. The run is repeated with the same harness
and torch.distributed.fsdp.sharded_grad_scaler.ShardedGradScaler, whose unscale_ all-reduces found_inf (a SUM of 0/1
flags, tested as "any"), as the reference: every rank must skip those steps, keep ShardedGradScaler's scale, and end
with its parameters.
"""
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

from helpers.comm import CommLedger
from helpers.grading.checks.lab12 import common
from helpers.grading.checks.lab12.common import TOL, WORLD_SIZE, flat, max_diff, record_scales
from helpers.grading.registry import answer, public_check
from helpers.grading.shared_run import definitions

STEPS, LR, INIT_SCALE, INTERVAL = 6, 0.1, 2.0**8, 2
TENSORS = 4  # the model's parameter tensors: rank 0 owns numbers 0 and 3, rank 1 number 1, rank 2 number 2


def _model():
    torch.manual_seed(22 + common.OFFSET)  # the same start on every rank
    return nn.Sequential(nn.Linear(4, 5), nn.Tanh(), nn.Linear(5, 2))


def injections():
    """{step: the parameter whose gradient rank 0 makes inf}: two steps, a parameter rank 1 or rank 2 owns."""
    first = 1 + common.OFFSET % 2
    return {first: 2 - common.OFFSET % 2, first + 3: 1 + common.OFFSET % 2}


def _owned(params, rank, world_size):
    return [p for index, p in enumerate(params) if index % world_size == rank]


def _to_owners(params):
    """The reference's reduce: each gradient's mean on its owner, freed elsewhere (chapters/capstone/zero.py)."""
    rank, world_size = dist.get_rank(), dist.get_world_size()
    for index, p in enumerate(params):
        dist.reduce(p.grad, dst=index % world_size)
        p.grad = p.grad.div_(world_size) if index % world_size == rank else None


def _from_owners(params):
    for index, p in enumerate(params):
        dist.broadcast(p.detach(), src=index % dist.get_world_size())


def _reference_step(params, optimizer, scaler):
    """ZeRO-2's step with ShardedGradScaler: its step() unscales the owned gradients and all-reduces found_inf."""
    _to_owners(params)
    scaler.step(optimizer)
    _from_owners(params)
    scaler.update()


def _train(step, scaler):
    """STEPS steps of ZeRO-2 with `step` on this rank: scales used, skipped steps, final parameters, collectives."""
    rank, world_size = dist.get_rank(), dist.get_world_size()
    model = _model()
    params = list(model.parameters())
    owned = _owned(params, rank, world_size)
    optimizer = torch.optim.SGD(owned, lr=LR)
    used, skipped, ops = record_scales(scaler), [], []
    g = torch.Generator().manual_seed(220 + rank + 10 * common.OFFSET)
    for t in range(STEPS):
        scaler.scale(model(torch.randn(3, 4, generator=g)).square().mean()).backward()
        if rank == 0 and t in injections():
            params[injections()[t]].grad.view(-1)[common.OFFSET % 2] = float("inf")
        before = flat(owned)
        with CommLedger() as ledger:
            step(params, optimizer, scaler)
        skipped.append(torch.equal(before, flat(owned)))
        ops.append([(r.op, r.payload_bytes) for r in ledger.records])
    return {"used": used, "skipped": skipped, "params": flat(params), "ops": ops}


def _on_rank(step_fn, scaler_cls):
    """Runs on every rank: the student's step with the LossScaler given, then the reference with ShardedGradScaler."""
    mine = _train(step_fn, scaler_cls(INIT_SCALE, growth_interval=INTERVAL))
    theirs = _train(_reference_step, ShardedGradScaler("cpu", init_scale=INIT_SCALE, growth_interval=INTERVAL))
    return {"mine": mine, "torch": theirs}


HINT = ("every rank must issue the same collectives in the same order, on every step, skipped or not: the "
        "reduces to the owners, one all-reduce of the found_inf flag, the broadcasts from the owners. ")


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
                f"{_ranks(r for r, s in enumerate(mine) if not s)} stepped: found_inf is only this rank's gradients'; "
                "all-reduce it (one number, ReduceOp.MAX) before step(), so that every rank skips together, as "
                "ShardedGradScaler.unscale_ does")
        if mine[0] != theirs:
            where = injections().get(t)
            raise AssertionError(
                f"step {t}: no rank skipped, although a gradient rank {where % WORLD_SIZE} owns holds an inf: skip "
                "when ANY rank found one: all-reduce the flag with MAX (or SUM, then test > 0), not MIN or a mean "
                "tested against 1" if where is not None and not mine[0] else
                f"step {t}: every rank {'skipped' if mine[0] else 'stepped'}, ShardedGradScaler's ranks "
                f"{'skipped' if theirs else 'stepped'}: unscale this rank's gradients with scaler.unscale_(optimizer) "
                "once, all-reduce found_inf, then scaler.step(optimizer) and scaler.update()")


@public_check("12.2")
def one_flag_all_reduced_per_step(ns):
    """The ledger per step: the reduces, ONE all-reduce of one number (the flag), the broadcasts."""
    for rank, result in enumerate(_results(ns)):
        for t, ops in enumerate(result["mine"]["ops"]):
            reduces = [nbytes for op, nbytes in ops if op == "all_reduce"]
            assert reduces, (f"rank {rank}, step {t}: no all-reduce: found_inf is never shared; all-reduce it (one "
                             f"number, MAX) after unscale_. The ledger shows {ops}")
            assert len(reduces) == 1 and reduces[0] <= 8, (
                f"rank {rank}, step {t}: all-reduces of {reduces} bytes; all-reduce only the flag, once: one number "
                "(4 bytes as float32), never the gradients (the reduces already gave each owner its mean gradients)")
            others = [op for op, _ in ops if op not in ("all_reduce", "broadcast")]
            assert others == ["reduce"] * TENSORS, (f"rank {rank}, step {t}: the ledger shows {ops}; expected a reduce "
                                                    "per parameter, one all_reduce of the flag, a broadcast per "
                                                    "parameter")


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
        assert diff == 0, (f"rank {rank}'s parameters differ from rank 0's by {diff:.3g}: broadcast every parameter "
                           "from its owner on every step (broadcast_from_owners)")
    diff = max_diff(results[0]["mine"]["params"], results[0]["torch"]["params"])
    assert diff < TOL, (
        f"the parameters are identical on every rank (the broadcast makes them so) but differ from "
        f"ShardedGradScaler's by {diff:.3g}: some ranks updated what they own on a step that others skipped, or a "
        "gradient was not unscaled exactly once")
