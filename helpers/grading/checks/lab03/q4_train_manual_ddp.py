"""Checks of lab 3.4: train_manual_ddp against one process on the global batch and against torch DDP."""
import functools
import math

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.utils.data import DistributedSampler

from helpers.comm import CommLedger
from helpers.grading.checks.lab03.common import TOL, WORLD_SIZE, _launch, _max_diff, _memoized, _sampler_indices
from helpers.grading.registry import answer, public_check
from helpers.grading.shared_run import definitions

# --- 3.4 train_manual_ddp -----------------------------------------------------------------------

NUM_SAMPLES, D_IN, D_OUT = 29, 5, 2
EPOCHS, BATCH, LR, SEED = 2, 4, 0.1, 3
STEPS = EPOCHS * math.ceil(NUM_SAMPLES // WORLD_SIZE / BATCH)  # 9 samples per rank per epoch: batches 4, 4, 1
PSI_3_4 = D_IN * 8 + 8 + 8 * D_OUT + D_OUT


def _model_3_4(seed):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(D_IN, 8), nn.Tanh(), nn.Linear(8, D_OUT))


def _dataset_3_4():
    generator = torch.Generator().manual_seed(SEED)
    X = torch.randn(NUM_SAMPLES, D_IN, generator=generator)
    return X, torch.sin(X[:, :D_OUT]) + 0.1 * torch.randn(NUM_SAMPLES, D_OUT, generator=generator)


def _flat(model):
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def _train_on_rank(train_manual_ddp):
    """Runs on every rank: a different initialisation, the student's loop, the ledger of its collectives."""
    model = _model_3_4(100 + dist.get_rank())
    X, Y = _dataset_3_4()
    with CommLedger() as ledger:
        losses = train_manual_ddp(model, X, Y, epochs=EPOCHS, batch_size=BATCH, lr=LR, seed=SEED)
    return _flat(model), losses, [(r.op, r.payload_bytes) for r in ledger.records]


def _ddp_on_rank():
    """Runs on every rank: the same job with torch DDP, DistributedSampler and torch.optim.SGD."""
    from torch.nn.parallel import DistributedDataParallel
    from torch.utils.data import DataLoader, TensorDataset

    model = DistributedDataParallel(_model_3_4(100 + dist.get_rank()))
    dataset = TensorDataset(*_dataset_3_4())
    sampler = DistributedSampler(dataset, shuffle=True, seed=SEED, drop_last=True)
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    for epoch in range(EPOCHS):
        sampler.set_epoch(epoch)
        for x, y in DataLoader(dataset, batch_size=BATCH, sampler=sampler):
            optimizer.zero_grad()
            nn.functional.mse_loss(model(x), y).backward()
            optimizer.step()
    return _flat(model.module)


@functools.cache
def _ddp_reference():
    """Rank 0's parameters after torch DDP training; the same for every student, computed once."""
    return _launch(_ddp_on_rank, hang_timeout=60.0)[0]


def _single_process_reference(epoch_fixed=False, drop_last=True, zero_grad=True):
    """One process, rank 0's initialisation, the global batch of every step; and each rank's local losses.

    The flags rebuild the usual mistakes (the same shuffle every epoch, padded shards, gradients never zeroed), so a
    check can name the one that gives the student's parameters.
    """
    model, (X, Y) = _model_3_4(100), _dataset_3_4()
    local_losses = [[] for _ in range(WORLD_SIZE)]
    for epoch in range(EPOCHS):
        e = 0 if epoch_fixed else epoch
        shards = [_sampler_indices(NUM_SAMPLES, r, WORLD_SIZE, True, SEED, e, drop_last) for r in range(WORLD_SIZE)]
        for start in range(0, len(shards[0]), BATCH):
            batches = [shard[start:start + BATCH] for shard in shards]
            with torch.no_grad():
                for rank, idx in enumerate(batches):
                    local_losses[rank].append(nn.functional.mse_loss(model(X[idx]), Y[idx]).item())
            if zero_grad:
                model.zero_grad()
            idx = [i for batch in batches for i in batch]  # the ranks' batches are equal: the mean of their means
            nn.functional.mse_loss(model(X[idx]), Y[idx]).backward()
            with torch.no_grad():
                for p in model.parameters():
                    p -= LR * p.grad
    return _flat(model), local_losses


def _local_sgd_reference(rank):
    """Rank's parameters when it steps with its own gradient (average_gradients called after the step)."""
    model, (X, Y) = _model_3_4(100), _dataset_3_4()
    for epoch in range(EPOCHS):
        shard = _sampler_indices(NUM_SAMPLES, rank, WORLD_SIZE, True, SEED, epoch, True)
        for start in range(0, len(shard), BATCH):
            idx = shard[start:start + BATCH]
            model.zero_grad()
            nn.functional.mse_loss(model(X[idx]), Y[idx]).backward()
            with torch.no_grad():
                for p in model.parameters():
                    p -= LR * p.grad
    return _flat(model)


# (reference flags, the mistake that gives those parameters and its fix), most common first
_VARIANTS = (
    ({"epoch_fixed": True}, "the same order in every epoch: pass epoch=epoch to shard_indices"),
    ({"zero_grad": False}, "the gradients accumulate from step to step: zero the gradients (model.zero_grad()) "
                           "before each backward()"),
    ({"drop_last": False}, "the shards are padded: cut them, shard_indices(..., drop_last=True), as the docstring "
                           "says"),
)


def _which_mistake(params):
    """The usual mistake whose single-process rebuild gives params, or None."""
    for flags, mistake in _VARIANTS:
        if _max_diff(params, _single_process_reference(**flags)[0]) < TOL:
            return mistake
    return None


def _training_results(ns):
    train = answer(ns, "train_manual_ddp")
    hint = "Every rank must run the same number of steps and the same collectives in each. "
    return _memoized("3.4", definitions(ns), lambda: _launch(_train_on_rank, train, hint=hint))


@public_check("3.4")
def identical_on_every_rank_despite_different_data(ns):
    results = _training_results(ns)
    for rank in range(WORLD_SIZE):
        ops = {op for op, _ in results[rank][2]}
        assert "broadcast" in ops, (f"rank {rank}: no broadcast, so every rank keeps its own initialisation: call "
                                    "broadcast_parameters(model, src=0) first")
        assert "all_reduce" in ops, (f"rank {rank}: no all_reduce, so every rank follows its own gradients: call "
                                     "average_gradients(model) after loss.backward()")
    for rank in range(1, WORLD_SIZE):
        diff = _max_diff(results[rank][0], results[0][0])
        if diff and all(_max_diff(results[r][0], _local_sgd_reference(r)) < TOL for r in range(WORLD_SIZE)):
            raise AssertionError("each rank stepped before average_gradients, with its own gradient, so the ranks "
                                 "drifted apart: average, then step (backward, average_gradients, p -= lr * p.grad)")
        assert diff == 0, (f"after {STEPS} steps rank {rank}'s parameters differ from rank 0's by up to {diff:.3g}; "
                           "every rank must start from rank 0's parameters (broadcast_parameters) and step with "
                           "the same averaged gradient (average_gradients, not averaged parameters)")


@public_check("3.4")
def equals_one_process_on_the_global_batch(ns):
    params = _training_results(ns)[0][0]
    expected, _ = _single_process_reference()
    diff = _max_diff(params, expected)
    if diff >= TOL:
        mistake = _which_mistake(params)
        assert mistake is None, mistake
    assert diff < TOL, (f"after {STEPS} steps the parameters differ from one process training on the global batches "
                        f"by {diff:.3g} (tolerance {TOL:g}); check: shard_indices with shuffle=True, drop_last=True, "
                        "seed and the epoch number; zeroed gradients every step; mean loss; p -= lr * p.grad")


@public_check("3.4")
def equals_torch_ddp(ns):
    params = _training_results(ns)[0][0]
    diff = _max_diff(params, _ddp_reference())
    assert diff < TOL, (f"after {STEPS} steps the parameters differ from torch DistributedDataParallel's (same "
                        f"initialisation, DistributedSampler, torch.optim.SGD) by {diff:.3g} (tolerance {TOL:g})")


@public_check("3.4")
def returns_each_rank_local_losses(ns):
    _, expected = _single_process_reference()
    for rank, (_, losses, _) in enumerate(_training_results(ns)):
        assert isinstance(losses, (list, tuple)) and len(losses) == STEPS, (
            f"rank {rank} returned {type(losses).__name__} {losses!r:.80}; expected a list of {STEPS} floats, "
            f"one local loss per step ({EPOCHS} epochs x 3 batches of its 9 samples)")
        got = torch.tensor([float(v) for v in losses])
        assert torch.allclose(got, torch.tensor(expected[rank]), atol=1e-5), (
            f"rank {rank}'s losses {[round(v, 4) for v in got.tolist()]} are not the mean squared errors of its own "
            f"batches {[round(v, 4) for v in expected[rank]]}")


@public_check("3.4")
def one_all_reduce_of_4_psi_bytes_per_step(ns):
    expected = 4 * PSI_3_4
    for rank, (*_, records) in enumerate(_training_results(ns)):
        reduces = [payload for op, payload in records if op == "all_reduce"]
        others = sorted({op for op, _ in records if op not in ("all_reduce", "broadcast")})
        assert not others, f"rank {rank}: unexpected collectives {others}; only broadcast (once) and all_reduce"
        assert any(op == "broadcast" for op, _ in records), f"rank {rank}: no broadcast: call broadcast_parameters"
        assert reduces == [expected] * STEPS, (
            f"rank {rank}: the ledger shows {len(reduces)} all_reduce calls carrying {sum(reduces)} bytes in "
            f"{STEPS} steps; expected exactly one all_reduce of 4 * psi = {expected} bytes per step "
            f"(payloads seen: {sorted(set(reduces))})")
