"""Checks of lab 11.3: train_ddp, the planted DDP model whose auxiliary head gets no gradient."""
import functools

import torch
import torch.distributed as dist
import torch.nn.functional as F

from helpers.backend import rank_device
from helpers.grading.checks.lab11 import common
from helpers.grading.checks.lab11.common import TOL, WORLD_SIZE, _flat, _launch, _max_diff, _memoized
from helpers.grading.registry import answer, public_check
from helpers.grading.shared_run import definitions, run_failed

D_IN, D_OUT, ROWS, LR, STEPS, SEED = 4, 2, 5, 0.1, 3, 11

_HINT_UNUSED = ("DDP expected a gradient for every parameter, and aux_head got none (the loss does not use it): "
                "pass find_unused_parameters=True to DDP (or static_graph=True: the same head is unused every step). ")


def _data(rank):
    g = torch.Generator().manual_seed(SEED * 10 + rank + 1000 * common.OFFSET)  # a different shard on every rank
    X = torch.randn(ROWS, D_IN, generator=g)
    return X, torch.randn(ROWS, D_OUT, generator=g)


def _model(WithAuxHead):
    torch.manual_seed(SEED + 1000 * common.OFFSET)
    return WithAuxHead(D_IN, D_OUT)


def _train_on_rank(train_ddp, WithAuxHead):
    model = _model(WithAuxHead).to(rank_device())
    X, Y = (t.to(rank_device()) for t in _data(dist.get_rank()))
    train_ddp(model, X, Y, lr=LR, steps=STEPS)
    return _flat(model)


@functools.cache
def _reference(WithAuxHead, scale=1.0, rank=None):
    """One process: SGD on the mean of the ranks' losses (scaled: the usual extra division), or on one rank's."""
    model = _model(WithAuxHead)
    shards = [_data(r) for r in range(WORLD_SIZE)] if rank is None else [_data(rank)]
    for _ in range(STEPS):
        model.zero_grad()
        (scale * sum(F.mse_loss(model(X), Y) for X, Y in shards) / len(shards)).backward()
        with torch.no_grad():
            for p in model.parameters():
                if p.grad is not None:
                    p -= LR * p.grad
    return _flat(model)


def _results(ns):
    from helpers.errors import RankFailed

    fn, model_class = answer(ns, "train_ddp"), answer(ns, "WithAuxHead")

    def run():
        try:
            return _launch(_train_on_rank, fn, model_class)
        except RankFailed as exc:
            if "find_unused_parameters" in str(exc):
                raise run_failed(exc, _HINT_UNUSED) from None
            raise

    return _memoized("11.3", definitions(ns), run)


@public_check("11.3")
def identical_parameters_on_every_rank(ns):
    results, model_class = _results(ns), answer(ns, "WithAuxHead")
    for rank in range(1, WORLD_SIZE):
        diff = _max_diff(results[rank], results[0])
        if diff and all(_max_diff(results[r], _reference(model_class, rank=r)) < TOL for r in range(WORLD_SIZE)):
            raise AssertionError("each rank stepped with its own gradient, so the ranks drifted apart: call the DDP "
                                 "wrapper, loss = F.mse_loss(ddp(X), Y), not the bare model or ddp.module, so its "
                                 "hooks average the gradients")
        assert diff == 0, (f"after {STEPS} steps rank {rank}'s parameters differ from rank 0's by up to {diff:.3g}: "
                           "train through DDP(model, find_unused_parameters=True)")


@public_check("11.3")
def equal_to_one_process_on_the_mean_loss(ns):
    params, model_class = _results(ns)[0], answer(ns, "WithAuxHead")
    diff = _max_diff(params, _reference(model_class))
    if diff >= TOL and _max_diff(params, _reference(model_class, scale=1 / WORLD_SIZE)) < TOL:
        raise AssertionError(f"the loss is divided by the world size ({WORLD_SIZE}): DDP already averages the "
                             "gradients over ranks (their mean, not their sum): drop the division")
    assert diff < TOL, (f"after {STEPS} steps the parameters differ from one process on the mean of the ranks' "
                        f"losses by {diff:.3g} (tolerance {TOL:g}): SGD(lr=lr) on F.mse_loss(ddp(X), Y), "
                        "zero_grad, backward, step")
