"""Public checks of lab 05: accumulation with DDP's no_sync, an alpha-beta step-time simulator, micro-batches.

5.1 runs the student's accumulate_and_step on DDP ranks (Gloo, CPU tensors): the CommLedger counts one bucket set of
all-reduces per optimizer step (read from step 3 on: DDP rebuilds its buckets after the first iteration), and the
parameters equal one process on the whole global batch. 5.2 compares predictions with helpers.theory's ring formula
on instructor inputs. 5.3 checks the sharding, then trains with 5.1 and 5.3 together on ranks with different data.
Wrong answers are recognised where possible (loss divided by the number of micro-batches, backward-only no_sync,
no first bucket, ...) to say what to fix.
"""
import math

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from helpers.comm import CommLedger
from helpers.errors import CollectiveHang, RankFailed
from helpers.grading.registry import answer, public_check
from helpers.launch import launch
from helpers.simulate import Link
from helpers.theory import collective_time

TOL = 1e-5  # float32 parameters of size ~0.3 after 2-3 SGD steps; sums in another order differ by ~1e-7
REL_TOL = 1e-9  # predictions: the same formula summed in another order
HANG_TIMEOUT = 15.0  # seconds without progress before a check reports a hang
D_IN, HIDDEN, N_CLASSES = 6, 32, 3
BUCKET_CAP_MB = 0.004  # about 4 KB: this model's 5.5 KB of gradients take two buckets
MICRO_SIZES = ([2, 5, 1], [4, 4], [8])  # rank r's micro-batch sizes in 5.1: unequal, 8 samples on every rank
COUNT_SIZES = ([3, 3, 2], [5, 2, 1])  # the count check: as many micro-batches on every rank, of unequal sizes
MiB = 2**20


# ---------------------------------------------------------------------------------------------- shared pieces
def make_model(seed=0):
    """A tiny classifier, identical on every rank for the same seed."""
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(D_IN, HIDDEN), nn.Tanh(), nn.Linear(HIDDEN, HIDDEN), nn.Tanh(),
                         nn.Linear(HIDDEN, N_CLASSES))


def make_batch(n, seed):
    """n samples: x (n, D_IN), labels y (n,)."""
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, D_IN, generator=g), torch.randint(0, N_CLASSES, (n,), generator=g)


def rank_micro_batches(sizes, rank, step):
    """Rank `rank`'s micro-batches at `step`, of the given sizes: different data on every rank and step."""
    x, y = make_batch(sum(sizes), seed=1000 * rank + 10 * step + 1)
    return list(zip(x.split(sizes), y.split(sizes)))


def flat_params(model):
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def max_diff(a, b):
    return (a - b).abs().max().item()


def all_reduce_calls(ledger):
    return ledger.totals().get("all_reduce", {"calls": 0})["calls"]


def run_on_ranks(fn, world_size, args=()):
    """launch() for checks: Gloo, short hang timeout; a hang or a crash becomes a failure that says what to look at."""
    try:
        return launch(fn, world_size, args=args, backend="gloo", hang_timeout=HANG_TIMEOUT)
    except CollectiveHang as exc:
        raise AssertionError(
            f"the ranks hung (no progress for {HANG_TIMEOUT:.0f} s): they did not issue the same collectives. Ranks "
            "may hold different numbers of micro-batches, so every rank must run exactly one synchronised backward "
            "per step: all micro-batches but the last inside no_sync() (forward and backward), the last outside it. "
            f"Launcher report:\n{exc}") from None
    except RankFailed as exc:
        if exc.exc_type == "NotImplementedError":
            raise
        raise AssertionError(f"a rank raised: {exc}") from None


def sgd_step(model, lr):
    with torch.no_grad():
        for p in model.parameters():
            p -= lr * p.grad


# ------------------------------------------------------------------------------------------------ question 5.1
def count_rank(fn, steps, lr):
    """On each rank: the all-reduces of one plain DDP step (a bucket set), then of every step of the answer."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    rank = dist.get_rank()
    plain = DDP(make_model(), bucket_cap_mb=BUCKET_CAP_MB)
    for step in range(3):  # count at step 3: DDP rebuilds its buckets after step 1
        x, y = make_batch(8, seed=1000 * rank + step + 500)
        plain.zero_grad()
        with CommLedger() as ledger:
            F.cross_entropy(plain(x), y).backward()
    bucket_set = all_reduce_calls(ledger)
    model = DDP(make_model(), bucket_cap_mb=BUCKET_CAP_MB)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    calls = []
    for step in range(steps):
        with CommLedger() as ledger:
            fn(model, optimizer, rank_micro_batches(COUNT_SIZES[rank], rank, step), F.cross_entropy)
        calls.append(all_reduce_calls(ledger))
    return bucket_set, calls


@public_check("5.1")
def one_bucket_set_per_optimizer_step(ns):
    fn = answer(ns, "accumulate_and_step")
    steps = 4
    results = run_on_ranks(count_rank, len(COUNT_SIZES), args=(fn, steps, 0.1))
    for rank, (bucket_set, calls) in enumerate(results):
        micro = len(COUNT_SIZES[rank])
        where = (f"rank {rank}, {micro} micro-batches per step, DDP with {bucket_set} buckets: all-reduces at steps "
                 f"1..{steps} = {calls}")
        for count in calls[2:]:
            if count == micro * bucket_set:
                raise AssertionError(
                    f"{where}: the gradients were all-reduced at every micro-batch ({micro} x {bucket_set}). Run the "
                    "forward AND the backward of every micro-batch but the last inside `with model.no_sync():` (a "
                    "backward inside no_sync whose forward ran outside it is still synchronised: DDP reads the flag "
                    "in the forward)")
            if count == 0:
                raise AssertionError(
                    f"{where}: no all-reduce at all, so the ranks never synchronise. The last micro-batch must run "
                    "outside no_sync()")
            assert count == bucket_set, (
                f"{where}: expected exactly one bucket set ({bucket_set} all-reduces) per optimizer step from step 3 "
                "on, and no collectives of your own")


def train_rank(fn, steps, lr):
    """On each rank: `steps` calls of the answer on a DDP model; the parameters and the returned losses."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    rank = dist.get_rank()
    model = DDP(make_model())
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    losses = [fn(model, optimizer, rank_micro_batches(MICRO_SIZES[rank], rank, step), F.cross_entropy)
              for step in range(steps)]
    return flat_params(model.module), losses


def one_process(steps, lr, weighting="size", zero_grad=True):
    """The parameters after `steps` SGD steps of one process emulating the ranks, and each rank's loss per step.

    weighting "size" (right: the mean over every sample of the global batch), "count" (each micro-batch's mean loss
    divided by the number of micro-batches) or "none" (micro-batch mean losses summed); zero_grad=False keeps the
    previous steps' gradients. The gradients of the ranks are averaged, as DDP does."""
    model = make_model()
    losses = []
    total = [torch.zeros_like(p) for p in model.parameters()]
    for step in range(steps):
        if zero_grad:
            total = [torch.zeros_like(p) for p in model.parameters()]
        step_losses = []
        for rank, sizes in enumerate(MICRO_SIZES):
            loss_sum = 0.0
            for x, y in rank_micro_batches(sizes, rank, step):
                weight = {"size": len(y) / sum(sizes), "count": 1 / len(sizes), "none": 1.0}[weighting]
                model.zero_grad()
                loss = F.cross_entropy(model(x), y)
                (loss * weight).backward()
                loss_sum += loss.item() * len(y) / sum(sizes)
                total = [t + p.grad / len(MICRO_SIZES) for t, p in zip(total, model.parameters())]
            step_losses.append(loss_sum)
        losses.append(step_losses)
        with torch.no_grad():
            for p, g in zip(model.parameters(), total):
                p -= lr * g
    return flat_params(model), losses


def whole_batch_reference(steps, lr):
    """One process on the whole global batch (every rank's micro-batches) at every step, mean loss, plain SGD."""
    model = make_model()
    for step in range(steps):
        batches = [b for rank, sizes in enumerate(MICRO_SIZES) for b in rank_micro_batches(sizes, rank, step)]
        model.zero_grad()
        F.cross_entropy(model(torch.cat([b[0] for b in batches])), torch.cat([b[1] for b in batches])).backward()
        sgd_step(model, lr)
    return flat_params(model)


@public_check("5.1")
def same_steps_as_one_process_on_the_whole_batch(ns):
    fn = answer(ns, "accumulate_and_step")
    steps, lr = 2, 0.5
    results = run_on_ranks(train_rank, len(MICRO_SIZES), args=(fn, steps, lr))
    where = f"{len(MICRO_SIZES)} ranks with micro-batches of {list(MICRO_SIZES)} samples, {steps} SGD steps"
    params = [p for p, _ in results]
    for rank, p in enumerate(params):
        assert torch.equal(p, params[0]), (
            f"{where}: rank {rank}'s parameters differ from rank 0's by {max_diff(p, params[0]):.2e}: the ranks did "
            "not step with the same gradient. Did the last micro-batch run inside no_sync()?")
    error = max_diff(params[0], whole_batch_reference(steps, lr))
    if error > TOL:
        hints = {"count": "each micro-batch's mean loss was divided by the number of micro-batches: with "
                          "micro-batches of unequal sizes, weight micro-batch i by len(y_i) / (this rank's samples)",
                 "none": "the micro-batch losses were not scaled, so the gradient is a sum of micro-batch means: "
                         "weight micro-batch i by len(y_i) / (this rank's samples)"}
        hint = next((text for weighting, text in hints.items()
                     if max_diff(params[0], one_process(steps, lr, weighting)[0]) <= TOL), "")
        if not hint and max_diff(params[0], one_process(steps, lr, zero_grad=False)[0]) <= TOL:
            hint = "the previous step's gradients were still in .grad: start with optimizer.zero_grad()"
        raise AssertionError(f"{where}: identical on every rank, but max |parameters - one process on the whole "
                             f"batch| = {error:.2e} (tolerance {TOL:.0e}). {hint}")
    expected_losses = one_process(steps, lr)[1]
    for rank, (_, losses) in enumerate(results):
        got = [float(v) for v in losses]
        want = [step_losses[rank] for step_losses in expected_losses]
        close = len(got) == len(want) and all(math.isclose(a, b, rel_tol=1e-4, abs_tol=1e-5)
                                              for a, b in zip(got, want))
        assert close, (f"{where}: rank {rank} returned losses {got}, expected its mean loss over its samples at each "
                       f"step: {want}")


# ------------------------------------------------------------------------------------------------ question 5.2
A100ISH = Link("instructor: 300 GB/s, 3 us", 3e-6, 300e9)
IB = Link("instructor: 25 GB/s, 10 us", 10e-6, 25e9)
SLOW = Link("instructor: 1 GB/s, 300 us", 300e-6, 1e9)
MEDIUM = Link("instructor: 10 GB/s, 10 us", 10e-6, 10e9)

# (num_params, world_size, compute_s, link, keyword arguments)
STEP_CASES = [
    (1e8, 8, 0.2, A100ISH, dict(bytes_per_param=2)),
    (1e8, 8, 0.2, A100ISH, dict(bytes_per_param=2, overlap=2 / 3)),
    (1.5e9, 64, 0.5, IB, dict(bytes_per_param=2, overlap=2 / 3)),
    (5e4, 3, 1e-3, SLOW, dict()),  # 200 KB: less than the first bucket
    ((MiB + 2 * 25 * MiB) / 4, 4, 0.01, MEDIUM, dict(overlap=0.5)),  # exactly 1 MiB + 2 x 25 MiB
    (3e7, 16, 0.05, MEDIUM, dict(bucket_cap_bytes=4 * MiB, first_bucket_bytes=4 * MiB, overlap=1.0)),
]


def bucket_list(total, cap=25 * MiB, first=MiB):
    """DDP's bucket sizes for `total` bytes: the first holds min(first, total), then buckets of cap, the rest last."""
    buckets = [min(first, total)]
    while sum(buckets) < total:
        buckets.append(min(cap, total - sum(buckets)))
    return buckets


def expected_step(num_params, world_size, compute_s, link, *, bytes_per_param=4, bucket_cap_bytes=25 * MiB,
                  first_bucket_bytes=MiB, overlap=0.0, variant="right"):
    """The reference prediction, and the usual wrong ones (variant) for hints."""
    if world_size == 1:
        return compute_s
    total = num_params * bytes_per_param
    buckets = {"right": bucket_list(total, bucket_cap_bytes, first_bucket_bytes),
               "no first bucket": bucket_list(total, bucket_cap_bytes, bucket_cap_bytes),
               "one bucket": [total]}.get(variant, bucket_list(total, bucket_cap_bytes, first_bucket_bytes))
    op = "unchunked_ring_all_reduce" if variant == "unchunked ring" else "all_reduce"
    comm = sum(collective_time(op, b, world_size, link.alpha_s, link.beta_s_per_byte) for b in buckets)
    if variant == "overlap ignored":
        return compute_s + comm
    if variant == "full overlap":
        return max(compute_s, comm)
    return compute_s + max(0.0, comm - overlap * compute_s)


STEP_HINTS = {
    "no first bucket": "DDP's first bucket holds only first_bucket_bytes (1 MiB); buckets of bucket_cap_bytes come "
                       "after it",
    "one bucket": "every bucket is its own all-reduce and pays the latency 2(N-1) alpha again: cut the gradient bytes "
                  "into buckets",
    "unchunked ring": "that is the unchunked ring, (N-1)(alpha + S beta): use helpers.theory.ring_all_reduce_time, "
                      "2(N-1) alpha + 2(N-1)/N S beta",
    "overlap ignored": "communication can hide under overlap * compute_s: step = compute_s + max(0, comm - overlap * "
                       "compute_s)",
    "full overlap": "max(compute, comm) assumes communication can hide under all of the compute; only a fraction "
                    "`overlap` of it",
}


def describe(case):
    num_params, world_size, compute_s, link, kwargs = case
    extra = "".join(f", {k}={v!r}" if isinstance(v, bool) else f", {k}={v:.4g}" for k, v in kwargs.items())
    return f"predict_step_time({num_params:.4g}, {world_size}, {compute_s}, <{link.name}>{extra})"


@public_check("5.2")
def step_time_matches_the_ring_formula_per_bucket(ns):
    fn = answer(ns, "predict_step_time")
    for case in STEP_CASES:
        num_params, world_size, compute_s, link, kwargs = case
        got = fn(num_params, world_size, compute_s, link, **kwargs)
        want = expected_step(num_params, world_size, compute_s, link, **kwargs)
        if isinstance(got, (int, float)) and math.isclose(got, want, rel_tol=REL_TOL):
            continue
        hint = next((text for variant, text in STEP_HINTS.items() if isinstance(got, (int, float))
                     and math.isclose(got, expected_step(*case[:4], **kwargs, variant=variant), rel_tol=REL_TOL)), "")
        raise AssertionError(f"{describe(case)} returned {got!r}, expected {want:.6g} s. {hint}".rstrip())


@public_check("5.2")
def one_gpu_has_no_communication(ns):
    fn = answer(ns, "predict_step_time")
    got = fn(1e9, 1, 0.3, SLOW, bytes_per_param=2)
    assert isinstance(got, (int, float)) and math.isclose(got, 0.3, rel_tol=REL_TOL), (
        f"predict_step_time(1e9, 1, 0.3, ...) returned {got!r}: one GPU all-reduces with nobody, so its step is "
        "compute_s = 0.3 s")


def expected_efficiency(num_params, world_size, compute_s, link, *, weak=True, **kwargs):
    per_gpu = compute_s if weak else compute_s / world_size
    step = expected_step(num_params, world_size, per_gpu, link, **kwargs)
    return compute_s / (step if weak else world_size * step)


EFFICIENCY_CASES = [
    (1.5e9, 64, 0.5, IB, dict(bytes_per_param=2, overlap=2 / 3)),
    (1e8, 8, 0.2, A100ISH, dict(bytes_per_param=2)),
    (2.5e7, 3, 0.05, MEDIUM, dict(overlap=0.5)),
]


@public_check("5.2")
def scaling_efficiency_weak_and_strong(ns):
    fn = answer(ns, "scaling_efficiency")
    for num_params, world_size, compute_s, link, kwargs in EFFICIENCY_CASES:
        for weak in (True, False):
            got = fn(num_params, world_size, compute_s, link, weak=weak, **kwargs)
            want = expected_efficiency(num_params, world_size, compute_s, link, weak=weak, **kwargs)
            other = expected_efficiency(num_params, world_size, compute_s, link, weak=not weak, **kwargs)
            call = describe((num_params, world_size, compute_s, link, {**kwargs, "weak": weak}))
            call = call.replace("predict_step_time", "scaling_efficiency")
            ok = isinstance(got, (int, float)) and math.isclose(got, want, rel_tol=REL_TOL)
            swapped = isinstance(got, (int, float)) and math.isclose(got, other, rel_tol=REL_TOL)
            hint = (" That is the other kind of scaling: weak keeps compute_s per GPU, strong splits compute_s over "
                    "the N GPUs and divides by N." if swapped else "")
            assert ok, f"{call} returned {got!r}, expected {want:.6g}.{hint}"
    assert math.isclose(fn(1e9, 1, 0.3, SLOW), 1.0, rel_tol=REL_TOL), "on one GPU the efficiency is 1 by definition"


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
