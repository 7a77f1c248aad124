"""Checks of lab 5.3: micro_batches_of_rank shards the global batch; with 5.1, ranks end identical."""
import torch
import torch.nn.functional as F

from helpers.grading.checks.lab05.common import (
    TOL,
    flat_params,
    make_batch,
    make_model,
    max_diff,
    run_on_ranks,
    sgd_step,
)
from helpers.grading.registry import answer, public_check


# ------------------------------------------------------------------------------------------------ question 5.3
def shards_rank(fn, batch, sizes):
    """On each rank: the answer's micro-batches for a numbered global batch, for each micro-batch size."""
    x = torch.arange(batch * 2, dtype=torch.float32).reshape(batch, 2)
    y = torch.arange(batch)
    return [[(xi.clone(), yi.clone()) for xi, yi in fn(x, y, size)] for size in sizes]


@public_check("5.3")
def shards_and_micro_batches(ns):
    fn = answer(ns, "micro_batches_of_rank")
    batch, world_size, sizes = 24, 3, (3, 10, 1)
    results = run_on_ranks(shards_rank, world_size, args=(fn, batch, sizes))
    per_rank = batch // world_size
    for rank, per_size in enumerate(results):
        for size, micro in zip(sizes, per_size):
            rows = list(range(rank * per_rank, (rank + 1) * per_rank))
            expected = [rows[i:i + size] for i in range(0, per_rank, size)]
            got = [yi.tolist() for _, yi in micro]
            assert got == expected, (
                f"global batch of {batch} samples (y = 0..{batch - 1}) on {world_size} ranks, "
                f"micro_batch_size={size}: rank {rank} returned micro-batches with y = {got}, expected {expected} "
                "(rank r keeps rows r*B/N .. (r+1)*B/N - 1, cut in order)")
            for xi, yi in micro:
                assert torch.equal(xi[:, 0], 2 * yi.float()), f"rank {rank}: x and y rows do not match"


def uneven_rank(fn):
    try:
        fn(torch.zeros(10, 2), torch.zeros(10), 4)
    except ValueError:
        return "ValueError"
    return "no error"


@public_check("5.3")
def uneven_global_batch_raises_value_error(ns):
    fn = answer(ns, "micro_batches_of_rank")
    outcomes = run_on_ranks(uneven_rank, 3, args=(fn,))
    assert outcomes == ["ValueError"] * 3, (
        f"a global batch of 10 samples on 3 ranks: expected ValueError on every rank, got {outcomes}")


def final_rank(accumulate, split, world_size, global_batch, micro_batch_size, steps, lr, seed):
    """On each rank: STEPS DDP steps, every rank's micro-batches from the answer, one optimizer step each."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    model = DDP(make_model(seed))
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    first_rows = []
    for step in range(steps):
        x, y = make_batch(global_batch, seed=seed + 100 * (step + 1))  # the same global batch on every rank
        micro = split(x, y, micro_batch_size)
        first_rows.append(micro[0][0][0].clone())
        accumulate(model, optimizer, micro, F.cross_entropy)
    return flat_params(model.module), first_rows


@public_check("5.3")
def different_data_identical_parameters(ns):
    accumulate, split = answer(ns, "accumulate_and_step"), answer(ns, "micro_batches_of_rank")
    world_size, global_batch = int(ns.get("WORLD_SIZE", 3)), int(ns.get("GLOBAL_BATCH", 24))
    micro_size, steps = int(ns.get("MICRO_BATCH_SIZE", 3)), int(ns.get("STEPS", 3))
    lr, seed, tol = float(ns.get("LR", 0.2)), int(ns.get("SEED", 0)), float(ns.get("TOL", TOL))
    assert world_size >= 2 and global_batch % world_size == 0 and steps >= 1, (
        f"WORLD_SIZE={world_size}, GLOBAL_BATCH={global_batch}, STEPS={steps}: need 2 or more ranks, a global batch "
        "that divides by WORLD_SIZE and one step or more")
    results = run_on_ranks(final_rank, world_size,
                           args=(accumulate, split, world_size, global_batch, micro_size, steps, lr, seed))
    where = (f"{world_size} ranks, global batch {global_batch} ({global_batch // world_size} per rank, micro-batches "
             f"of at most {micro_size}), {steps} SGD steps (lr {lr})")
    firsts = [torch.stack(rows) for _, rows in results]
    assert all(not torch.equal(firsts[r], firsts[s]) for r in range(world_size) for s in range(r)), (
        f"{where}: two ranks trained on the same data; each rank must keep its own shard")
    params = [p for p, _ in results]
    for rank, p in enumerate(params):
        assert torch.equal(p, params[0]), (
            f"{where}: rank {rank}'s parameters differ from rank 0's by {max_diff(p, params[0]):.2e}: the ranks "
            "drifted apart. Every rank must step with the same all-reduced gradient")
    model = make_model(seed)
    for step in range(steps):
        x, y = make_batch(global_batch, seed=seed + 100 * (step + 1))
        model.zero_grad()
        F.cross_entropy(model(x), y).backward()
        sgd_step(model, lr)
    error = max_diff(params[0], flat_params(model))
    assert error <= tol, (f"{where}: identical on every rank, but max |parameters - one process on the whole batch| = "
                          f"{error:.2e} (tolerance {tol:.0e})")
