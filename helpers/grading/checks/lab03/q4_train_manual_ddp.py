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


def _dataset_3_4(offset=0):
    generator = torch.Generator().manual_seed(SEED + offset)
    X = torch.randn(NUM_SAMPLES, D_IN, generator=generator)
    return X, torch.sin(X[:, :D_OUT]) + 0.1 * torch.randn(NUM_SAMPLES, D_OUT, generator=generator)


def _flat(model):
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def _train_on_rank(train_manual_ddp, offset=0):
    """Runs on every rank: a different initialisation, the student's loop, the ledger of its collectives.

    offset: moves the initialisations, the data and the shuffling seed (the grader's hidden test: its secret seed)."""
    model = _model_3_4(100 + offset + dist.get_rank())
    X, Y = _dataset_3_4(offset)
    with CommLedger() as ledger:
        losses = train_manual_ddp(model, X, Y, epochs=EPOCHS, batch_size=BATCH, lr=LR, seed=SEED + offset)
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


@functools.cache
def _single_process_reference(epoch_fixed=False, drop_last=True, zero_grad=True, offset=0):
    """One process, rank 0's initialisation, the global batch of every step; and each rank's local losses.

    The flags rebuild the usual mistakes (the same shuffle every epoch, padded shards, gradients never zeroed), so a
    check can name the one that gives the student's parameters.
    """
    model, (X, Y) = _model_3_4(100 + offset), _dataset_3_4(offset)
    local_losses = [[] for _ in range(WORLD_SIZE)]
    for epoch in range(EPOCHS):
        e = 0 if epoch_fixed else epoch
        shards = [_sampler_indices(NUM_SAMPLES, r, WORLD_SIZE, True, SEED + offset, e, drop_last)
                  for r in range(WORLD_SIZE)]
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


def _local_sgd_reference(rank, offset=0):
    """Rank's parameters when it steps with its own gradient (average_gradients called after the step)."""
    model, (X, Y) = _model_3_4(100 + offset), _dataset_3_4(offset)
    for epoch in range(EPOCHS):
        shard = _sampler_indices(NUM_SAMPLES, rank, WORLD_SIZE, True, SEED + offset, epoch, True)
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


def _which_mistake(params, offset=0):
    """The usual mistake whose single-process rebuild gives params, or None."""
    for flags, mistake in _VARIANTS:
        if _max_diff(params, _single_process_reference(**flags, offset=offset)[0]) < TOL:
            return mistake
    return None


def _training_results(ns):
    train = answer(ns, "train_manual_ddp")
    return _memoized("3.4", definitions(ns), lambda: _launch(_train_on_rank, train, hint=HINT))


# What a run that did not finish says first (the grader's hidden test says it too).
HINT = "Every rank must run the same number of steps and the same collectives in each. "


def _not_synchronised(results, offset=0):
    """Why the ranks end with different parameters (no broadcast, no all-reduce, a step before averaging), or None."""
    for rank in range(WORLD_SIZE):
        ops = {op for op, _ in results[rank][2]}
        if "broadcast" not in ops:
            return (f"rank {rank}: no broadcast, so every rank keeps its own initialisation: call "
                    "broadcast_parameters(model, src=0) first")
        if "all_reduce" not in ops:
            return (f"rank {rank}: no all_reduce, so every rank follows its own gradients: call "
                    "average_gradients(model) after loss.backward()")
    for rank in range(1, WORLD_SIZE):
        diff = _max_diff(results[rank][0], results[0][0])
        if diff and all(_max_diff(results[r][0], _local_sgd_reference(r, offset)) < TOL for r in range(WORLD_SIZE)):
            return ("each rank stepped before average_gradients, with its own gradient, so the ranks drifted apart: "
                    "average, then step (backward, average_gradients, p -= lr * p.grad)")
        if diff:
            return (f"after {STEPS} steps rank {rank}'s parameters differ from rank 0's; every rank must start from "
                    "rank 0's parameters (broadcast_parameters) and step with the same averaged gradient "
                    "(average_gradients, not averaged parameters)")
    return None


def _not_one_process(results, offset=0):
    params = results[0][0]
    if _max_diff(params, _single_process_reference(offset=offset)[0]) < TOL:
        return None
    return _which_mistake(params, offset) or (
        f"after {STEPS} steps the parameters differ from one process training on the global batches; check: "
        "shard_indices with shuffle=True, drop_last=True, seed and the epoch number; zeroed gradients every step; "
        "mean loss; p -= lr * p.grad")


def _not_local_losses(results, offset=0):
    """(why, rank) of the first rank whose losses are not its batches' mean squared errors, or None."""
    _, expected = _single_process_reference(offset=offset)
    for rank, (_, losses, _) in enumerate(results):
        if not (isinstance(losses, (list, tuple)) and len(losses) == STEPS):
            return (f"rank {rank} returned {type(losses).__name__}; expected a list of {STEPS} floats, one local "
                    f"loss per step ({EPOCHS} epochs x 3 batches of its 9 samples)"), rank
        if not torch.allclose(torch.tensor([float(v) for v in losses]), torch.tensor(expected[rank]), atol=1e-5):
            return f"rank {rank}'s losses are not the mean squared errors of its own batches", rank
    return None


def _not_one_all_reduce(results, offset=0):
    """(why, rank) of the first rank whose collectives are not one broadcast and one all-reduce per step, or None."""
    expected = 4 * PSI_3_4
    for rank, (*_, records) in enumerate(results):
        reduces = [payload for op, payload in records if op == "all_reduce"]
        others = sorted({op for op, _ in records if op not in ("all_reduce", "broadcast")})
        if others:
            return f"rank {rank}: unexpected collectives {others}; only broadcast (once) and all_reduce", rank
        if not any(op == "broadcast" for op, _ in records):
            return f"rank {rank}: no broadcast: call broadcast_parameters", rank
        if reduces != [expected] * STEPS:
            return (f"rank {rank}: the ledger shows {len(reduces)} all_reduce calls carrying {sum(reduces)} bytes in "
                    f"{STEPS} steps; expected exactly one all_reduce of 4 * psi = {expected} bytes per step"), rank
    return None


def diagnose(results, offset=0):
    """The first mistake the checks below report, without a value of the right answer, or None (the DDP comparison
    left out: the grader says the same of its hidden test's run, which has no DDP to compare with)."""
    for rule in (_not_synchronised, _not_one_process, _not_local_losses, _not_one_all_reduce):
        why = rule(results, offset)
        if why:
            return why if isinstance(why, str) else why[0]
    return None


@public_check("3.4")
def identical_on_every_rank_despite_different_data(ns):
    results = _training_results(ns)
    why = _not_synchronised(results)
    if why and "differ from rank 0's" in why:
        rank = next(r for r in range(1, WORLD_SIZE) if _max_diff(results[r][0], results[0][0]))
        why = why.replace("differ from rank 0's", f"differ from rank 0's by up to "
                                                  f"{_max_diff(results[rank][0], results[0][0]):.3g}")
    assert not why, why


@public_check("3.4")
def equals_one_process_on_the_global_batch(ns):
    params = _training_results(ns)[0][0]
    why = _not_one_process(_training_results(ns))
    if why and why.startswith(f"after {STEPS} steps the parameters differ"):
        diff = _max_diff(params, _single_process_reference()[0])
        why = why.replace("global batches;", f"global batches by {diff:.3g} (tolerance {TOL:g});")
    assert not why, why


@public_check("3.4")
def equals_torch_ddp(ns):
    params = _training_results(ns)[0][0]
    diff = _max_diff(params, _ddp_reference())
    assert diff < TOL, (f"after {STEPS} steps the parameters differ from torch DistributedDataParallel's (same "
                        f"initialisation, DistributedSampler, torch.optim.SGD) by {diff:.3g} (tolerance {TOL:g})")


@public_check("3.4")
def returns_each_rank_local_losses(ns):
    results = _training_results(ns)
    wrong = _not_local_losses(results)
    if wrong and "are not" in wrong[0]:
        why, rank = wrong
        got, expected = [round(float(v), 4) for v in results[rank][1]], _single_process_reference()[1][rank]
        why = why.replace("losses are", f"losses {got} are") + f" {[round(v, 4) for v in expected]}"
    elif wrong:
        why, rank = wrong
        name = type(results[rank][1]).__name__
        why = why.replace(f"returned {name};", f"returned {name} {results[rank][1]!r:.80};")
    assert not wrong, wrong and why


@public_check("3.4")
def one_all_reduce_of_4_psi_bytes_per_step(ns):
    results = _training_results(ns)
    wrong = _not_one_all_reduce(results)
    if wrong and "expected exactly" in wrong[0]:
        why, rank = wrong
        seen = sorted({payload for op, payload in results[rank][2] if op == "all_reduce"})
        raise AssertionError(f"{why} (payloads seen: {seen})")
    assert not wrong, wrong and wrong[0]
