"""Public checks of lab 03 (manual DDP): sharding, broadcast, gradient averaging, the training loop.

Multi-rank checks run the student's functions on 3 ranks (an odd world size: uneven shards) through
helpers.launch; the functions travel by value. One launch serves all the checks of a question: its
result is kept, keyed by the student's function objects, until they are redefined.
"""
import functools
import itertools
import math
import warnings

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.utils.data import DistributedSampler

from helpers.comm import CommLedger
from helpers.grading.registry import answer, public_check
from helpers.grading.shared_run import SharedRun, launch_on_gloo

WORLD_SIZE = 3  # odd on purpose: 29 samples do not split evenly
HANG_S = 20.0  # a check whose ranks wait longer than this reports CollectiveHang instead of hanging
# float32 parameters of size <= 1 after a few SGD steps: sums taken in another order differ by a few
# roundings of 2**-24 (about 6e-8); 1e-6 allows that and is far below any real bug (chapter 03, section 6).
TOL = 1e-6

_memoized = SharedRun()  # one launch serves every check of a question


def _launch(fn, *args, hang_timeout=HANG_S, hint=""):
    """Run fn on WORLD_SIZE Gloo ranks; a hang or a crashed rank becomes a failure that says what to look at."""
    return launch_on_gloo(fn, WORLD_SIZE, args, hang_timeout, hint)


def _max_diff(a, b):
    return (a - b).abs().max().item()


# --- 3.1 shard_indices --------------------------------------------------------------------------

def _sampler_indices(num_samples, rank, world_size, shuffle, seed, epoch, drop_last):
    sampler = DistributedSampler(range(num_samples), num_replicas=world_size, rank=rank, shuffle=shuffle,
                                 seed=seed, drop_last=drop_last)
    sampler.set_epoch(epoch)
    return list(sampler)


def _compare_with_sampler(shard_indices, cases):
    """Assert shard_indices == DistributedSampler on every (num_samples, world_size, shuffle, seed, epoch, drop_last)."""
    for num_samples, world_size, shuffle, seed, epoch, drop_last in cases:
        for rank in range(world_size):
            call = (f"shard_indices({num_samples}, rank={rank}, world_size={world_size}, shuffle={shuffle}, "
                    f"seed={seed}, epoch={epoch}, drop_last={drop_last})")
            got = shard_indices(num_samples, rank, world_size, shuffle=shuffle, seed=seed, epoch=epoch,
                                drop_last=drop_last)
            expected = _sampler_indices(num_samples, rank, world_size, shuffle, seed, epoch, drop_last)
            assert got is not None, f"{call} returned None: return the list of indices"
            got = [int(i) for i in got]
            assert got == expected, f"{call} returned {got}; DistributedSampler gives {expected}"


@public_check("3.1")
def even_split_matches_sampler(ns):
    cases = itertools.product((12, 24), (1, 2, 3, 4), (False,), (0,), (0,), (False, True))
    _compare_with_sampler(answer(ns, "shard_indices"), cases)


@public_check("3.1")
def padding_matches_sampler(ns):
    """drop_last=False on lengths that do not divide: repeat from the start up to ceil(len / N) per rank."""
    cases = itertools.product((10, 11, 29, 50), (3, 4), (False,), (0,), (0,), (False,))
    _compare_with_sampler(answer(ns, "shard_indices"), cases)


@public_check("3.1")
def drop_last_matches_sampler(ns):
    cases = itertools.product((10, 11, 29, 50), (3, 4), (False,), (0,), (0,), (True,))
    _compare_with_sampler(answer(ns, "shard_indices"), cases)


@public_check("3.1")
def shuffle_and_epochs_match_sampler(ns):
    """The permutation comes from a generator seeded with seed + epoch: same on every rank, new every epoch."""
    cases = itertools.product((10, 29), (2, 3), (True,), (0, 7), (0, 1, 4), (False, True))
    _compare_with_sampler(answer(ns, "shard_indices"), cases)


@public_check("3.1")
def datasets_smaller_than_world_size(ns):
    """1 or 2 samples on up to 7 ranks: padding wraps around the order more than once."""
    cases = itertools.product((1, 2, 3), (3, 5, 7), (False, True), (0,), (0, 1), (False, True))
    _compare_with_sampler(answer(ns, "shard_indices"), cases)


@public_check("3.1")
def rejects_a_bad_rank(ns):
    shard_indices = answer(ns, "shard_indices")
    for rank in (3, -1):
        try:
            shard_indices(10, rank, 3, shuffle=False, seed=0, epoch=0, drop_last=False)
        except ValueError:
            continue
        raise AssertionError(f"shard_indices(10, rank={rank}, world_size=3, ...) should raise ValueError "
                             "(rank must be in 0 .. world_size - 1), as DistributedSampler does")


# --- 3.2 broadcast_parameters -------------------------------------------------------------------

def _bn_model():
    """Parameters and buffers, including BatchNorm's int64 num_batches_tracked."""
    return nn.Sequential(nn.Linear(4, 6), nn.BatchNorm1d(6), nn.Tanh(), nn.Linear(6, 2))


def _broadcast_on_rank(broadcast_parameters, src):
    """Runs on every rank: different parameters and buffers, the student's broadcast, what it left."""
    rank = dist.get_rank()
    torch.manual_seed(rank)
    model = _bn_model()
    for _ in range(rank + 1):  # different running statistics and num_batches_tracked on every rank
        model(torch.randn(5, 4))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    objects = [id(t) for t in itertools.chain(model.parameters(), model.buffers())]
    if src is None:
        broadcast_parameters(model)
    else:
        broadcast_parameters(model, src=src)
    after = {k: v.clone() for k, v in model.state_dict().items()}
    same_objects = objects == [id(t) for t in itertools.chain(model.parameters(), model.buffers())]
    trainable = all(p.requires_grad and p.is_leaf for p in model.parameters())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model(torch.randn(5, 4)).sum().backward()
    recorded = [str(w.message).split(": an autograd")[0] for w in caught
                if "autograd kernel was not registered" in str(w.message)]
    return before, after, same_objects, trainable, recorded


def _broadcast_results(ns, src):
    fn = answer(ns, "broadcast_parameters")
    return _memoized(f"3.2/{src}", fn, lambda: _launch(_broadcast_on_rank, fn, src))


def _assert_copied_from(results, src, how):
    source = results[src][0]
    for rank, (_, after, *_) in enumerate(results):
        for name, value in after.items():
            kind = "buffer" if name.split(".")[-1] in ("running_mean", "running_var", "num_batches_tracked") \
                else "parameter"
            hint = " (broadcast model.buffers() too, not only the parameters)" if kind == "buffer" else ""
            assert torch.equal(value, source[name]), (
                f"{how}: on rank {rank}, {kind} {name!r} is not rank {src}'s{hint}; "
                f"max difference {_max_diff(value.double(), source[name].double()):.3g}")


@public_check("3.2")
def parameters_and_buffers_come_from_src(ns):
    _assert_copied_from(_broadcast_results(ns, 1), 1, "broadcast_parameters(model, src=1) on 3 ranks")


@public_check("3.2")
def src_defaults_to_rank_0(ns):
    _assert_copied_from(_broadcast_results(ns, None), 0, "broadcast_parameters(model) on 3 ranks")


@public_check("3.2")
def in_place_same_objects(ns):
    for rank, (_, _, same_objects, trainable, _) in enumerate(_broadcast_results(ns, 1)):
        assert same_objects, (f"rank {rank}: the model's parameter or buffer objects were replaced; copy into "
                              "them in place (dist.broadcast(tensor, src) writes into tensor) so an optimizer "
                              "built earlier still holds the model's parameters")
        assert trainable, f"rank {rank}: parameters must stay trainable leaves (requires_grad=True, no grad_fn)"


@public_check("3.2")
def outside_autograd(ns):
    for rank, (*_, recorded) in enumerate(_broadcast_results(ns, 1)):
        assert not recorded, (f"rank {rank}: autograd recorded {recorded[0]} on the parameters and warned in the "
                              "next backward(); broadcast under torch.no_grad() (or broadcast p.detach())")


# --- 3.3 average_gradients ----------------------------------------------------------------------

def _frozen_model():
    """Layer 0 frozen (requires_grad=False); 53 trainable parameters in layers 2 and 4."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 6), nn.Tanh(), nn.Linear(6, 5), nn.Tanh(), nn.Linear(5, 3))
    model[0].requires_grad_(False)
    return model


TRAINABLE_3_3 = 6 * 5 + 5 + 5 * 3 + 3
UNUSED_ON_RANK_1 = "4.bias"  # its .grad is None on rank 1 only


def _grads(model):
    return {n: (None if p.grad is None else p.grad.clone()) for n, p in model.named_parameters()}


def _average_on_rank(average_gradients):
    """Runs on every rank: the same model, different data, then the student's average_gradients."""
    rank = dist.get_rank()
    model = _frozen_model()
    x = torch.randn(6 + rank, 4, generator=torch.Generator().manual_seed(10 + rank))  # different data and sizes
    model(x).square().mean().backward()
    if rank == 1:
        model[4].bias.grad = None  # as if this rank's forward had not used the parameter
    before, params = _grads(model), {n: p.detach().clone() for n, p in model.named_parameters()}
    with CommLedger() as ledger:
        average_gradients(model)
    moved = [n for n, p in model.named_parameters() if not torch.equal(p.detach(), params[n])]
    return before, _grads(model), moved, [(r.op, r.payload_bytes, r.numel) for r in ledger.records]


def _average_results(ns):
    fn = answer(ns, "average_gradients")
    hint = ("Every rank must all-reduce a buffer of the same size: count a missing .grad as zeros instead of "
            "skipping the parameter. ")
    return _memoized("3.3", fn, lambda: _launch(_average_on_rank, fn, hang_timeout=10.0, hint=hint))


def _expected_mean(results, name):
    grads = [before[name] if before[name] is not None else torch.zeros_like(results[0][0][name])
             for before, *_ in results]
    return torch.stack(grads).mean(dim=0)


@public_check("3.3")
def gradients_become_the_mean_over_ranks(ns):
    results = _average_results(ns)
    for rank, (before, after, moved, _) in enumerate(results):
        assert not moved, (f"rank {rank}: average_gradients changed the parameters {moved}: average the "
                           "gradients (p.grad), never the parameters (the picotron hook bug)")
        for name in ("2.weight", "2.bias", "4.weight"):
            expected = _expected_mean(results, name)
            got = after[name]
            assert got is not None, f"rank {rank}: {name}.grad is None after the call"
            if torch.allclose(got, WORLD_SIZE * expected, atol=TOL):
                raise AssertionError(f"rank {rank}: {name}.grad is the SUM over the 3 ranks; divide by the "
                                     "world size to get the mean")
            if torch.equal(got, before[name]):
                raise AssertionError(f"rank {rank}: {name}.grad is still this rank's own gradient; copy the "
                                     "averaged buffer back into the parameters' .grad")
            assert torch.allclose(got, expected, atol=TOL), (
                f"rank {rank}: {name}.grad is not the mean over ranks of the gradients "
                f"(max error {_max_diff(got, expected):.3g})")


@public_check("3.3")
def identical_on_every_rank(ns):
    results = _average_results(ns)
    for rank, (_, after, _, _) in enumerate(results[1:], start=1):
        for name, grad in after.items():
            if grad is not None and results[0][1][name] is not None:
                assert torch.equal(grad, results[0][1][name]), f"{name}.grad differs between rank 0 and rank {rank}"


@public_check("3.3")
def frozen_parameters_left_alone(ns):
    for rank, (_, after, _, _) in enumerate(_average_results(ns)):
        for name in ("0.weight", "0.bias"):
            assert after[name] is None, (f"rank {rank}: frozen parameter {name} (requires_grad=False) got a "
                                         ".grad; leave frozen parameters out")


@public_check("3.3")
def missing_gradient_counts_as_zero(ns):
    results = _average_results(ns)
    expected = _expected_mean(results, UNUSED_ON_RANK_1)  # rank 1 contributes zeros
    for rank, (_, after, _, _) in enumerate(results):
        got = after[UNUSED_ON_RANK_1]
        assert got is not None, (f"rank {rank}: {UNUSED_ON_RANK_1}.grad is None; a trainable parameter with no "
                                 "gradient on this rank counts as zeros and receives the mean like the others")
        assert torch.allclose(got, expected, atol=TOL), (
            f"rank {rank}: {UNUSED_ON_RANK_1}.grad should be (g_rank0 + 0 + g_rank2) / 3 (rank 1 had no gradient); "
            f"max error {_max_diff(got, expected):.3g}")


@public_check("3.3")
def one_flat_all_reduce(ns):
    expected = 4 * TRAINABLE_3_3
    for rank, (*_, records) in enumerate(_average_results(ns)):
        reduces = [r for r in records if r[0] == "all_reduce"]
        others = sorted({r[0] for r in records if r[0] != "all_reduce"})
        assert not others, f"rank {rank}: average_gradients issued {others}; use one all_reduce only"
        assert len(reduces) == 1, (
            f"rank {rank}: {len(reduces)} all_reduce calls (payloads {[r[1] for r in reduces]} bytes); flatten "
            "every trainable gradient into one buffer and all-reduce it once")
        assert reduces[0][1] == expected, (
            f"rank {rank}: the all_reduce carried {reduces[0][1]} bytes; expected {expected} = 4 bytes x "
            f"{TRAINABLE_3_3} trainable parameters (frozen ones stay out of the buffer)")


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


def _single_process_reference():
    """One process, rank 0's initialisation, the global batch of every step; and each rank's local losses."""
    model, (X, Y) = _model_3_4(100), _dataset_3_4()
    local_losses = [[] for _ in range(WORLD_SIZE)]
    for epoch in range(EPOCHS):
        shards = [_sampler_indices(NUM_SAMPLES, r, WORLD_SIZE, True, SEED, epoch, True) for r in range(WORLD_SIZE)]
        for start in range(0, len(shards[0]), BATCH):
            batches = [shard[start:start + BATCH] for shard in shards]
            with torch.no_grad():
                for rank, idx in enumerate(batches):
                    local_losses[rank].append(nn.functional.mse_loss(model(X[idx]), Y[idx]).item())
            model.zero_grad()
            idx = [i for batch in batches for i in batch]
            nn.functional.mse_loss(model(X[idx]), Y[idx]).backward()
            with torch.no_grad():
                for p in model.parameters():
                    p -= LR * p.grad
    return _flat(model), local_losses


def _training_results(ns):
    names = ("train_manual_ddp", "shard_indices", "broadcast_parameters", "average_gradients")
    fns = tuple(ns.get(name) for name in names)
    train = answer(ns, "train_manual_ddp")
    hint = "Every rank must run the same number of steps and the same collectives in each. "
    return _memoized("3.4", fns, lambda: _launch(_train_on_rank, train, hint=hint))


@public_check("3.4")
def identical_on_every_rank_despite_different_data(ns):
    results = _training_results(ns)
    for rank in range(1, WORLD_SIZE):
        diff = _max_diff(results[rank][0], results[0][0])
        assert diff == 0, (f"after {STEPS} steps rank {rank}'s parameters differ from rank 0's by up to {diff:.3g}; "
                           "every rank must start from rank 0's parameters (broadcast_parameters) and step with "
                           "the same averaged gradient (average_gradients, not averaged parameters)")


@public_check("3.4")
def equals_one_process_on_the_global_batch(ns):
    params = _training_results(ns)[0][0]
    expected, _ = _single_process_reference()
    diff = _max_diff(params, expected)
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
