"""Public checks of lab 04: a bucketed, overlapped DDP (assign_buckets, Bucket, Reducer, train_bucketed).

Multi-rank checks run the student's code through `helpers.launch` (Gloo, CPU) at world sizes 2 and 3, with different
data on every rank. Rank-side functions (`_on_ranks_*`) return plain data; expected values are computed here, in the
kernel, from the same deterministic data, and the messages name the usual wrong answers: averaging the parameters
instead of the gradients, not waiting for the all-reduce, one all-reduce per parameter, no overlap with backward.
Two checks make the last rank a straggler (it sleeps before its last gradient), so that a missing `wait()` gives
wrong gradients on rank 0 every time, not once in a while.
"""
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from helpers.comm import CommLedger
from helpers.errors import CollectiveHang, RankFailed
from helpers.grading.registry import answer, public_check
from helpers.launch import launch

HANG_TIMEOUT_S = 10.0
TOL = 1e-6  # float32 sums of a few numbers in another order (DDP multiplies by 1/N, we may divide by N)
SLOW_RANK_S = 0.3  # how long the straggler sleeps; launching an async all-reduce takes microseconds
LAYERS = (6, 10, 10, 7, 3)  # an MLP 6 -> 10 -> 10 -> 7 -> 3: eight tensors of uneven sizes
CAP_BYTES = 400  # buckets of the MLP above: parameters [7, 6, 5, 4], [3, 2], [1, 0]
CAP_MB = CAP_BYTES / 2**20  # the same cap as Reducer's bucket_cap_mb (exact: a power-of-two scale)
STEPS, LR, BATCH = 3, 0.1, 5


# --------------------------------------------------------------------------------------------- shared pieces
def make_model(seed):
    """The checks' MLP; identical for the same seed."""
    torch.manual_seed(seed)
    layers = []
    for d_in, d_out in zip(LAYERS, LAYERS[1:]):
        layers += [nn.Linear(d_in, d_out), nn.Tanh()]
    return nn.Sequential(*layers[:-1])


def rank_batch(step, rank):
    """(x, y) of a rank at a step: different on every rank and at every step."""
    generator = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(BATCH, LAYERS[0], generator=generator), torch.randn(BATCH, LAYERS[-1], generator=generator)


def reference_buckets(sizes_bytes, cap_bytes):
    """The rule of torch's dist._compute_bucket_assignment_by_size, on tensors given in reverse order."""
    buckets, current, filled = [], [], 0
    for index in reversed(range(len(sizes_bytes))):
        current.append(index)
        filled += sizes_bytes[index]
        if filled >= cap_bytes:
            buckets.append(current)
            current, filled = [], 0
    return buckets + ([current] if current else [])


def torch_buckets(params, cap_bytes):
    """torch's own assignment of the parameters in reverse order, or None if this PyTorch lacks the function."""
    compute = getattr(dist, "_compute_bucket_assignment_by_size", None)
    if compute is None:
        return None
    indices = list(reversed(range(len(params))))
    return [list(b) for b in compute([params[i] for i in indices], [cap_bytes], [], indices)[0]]


def nbytes(t):
    return t.numel() * t.element_size()


def flat(tensors):
    return torch.cat([t.reshape(-1) for t in tensors])


def max_diff(a, b):
    return (a - b).abs().max().item()


def run_on_ranks(fn, world_size, args, what):
    """launch() for checks: Gloo, short hang timeout; a hang or a crash becomes a failure that says what happened."""
    try:
        return launch(fn, world_size, args=args, backend="gloo", hang_timeout=HANG_TIMEOUT_S)
    except CollectiveHang as exc:
        raise AssertionError(
            f"{what} hung at world size {world_size} (no progress for {HANG_TIMEOUT_S:g} s): some rank issued an "
            f"all-reduce the others did not (a bucket launched twice, or never). Launcher report:\n{exc}") from None
    except RankFailed as exc:
        if exc.exc_type == "NotImplementedError":
            raise
        raise AssertionError(f"{what} at world size {world_size}: a rank raised: {exc}") from None


def local_grads(params_model, step, rank):
    """Gradients of one rank's loss at a step (no communication), for the model's current parameters."""
    params_model.zero_grad(set_to_none=True)
    x, y = rank_batch(step, rank)
    F.mse_loss(params_model(x), y).backward()
    return [p.grad.clone() for p in params_model.parameters()]


def diagnose(got, expected, local, params, world_size):
    """A hint naming the wrong answer that `got` matches, or ''."""
    wrong = {"the average of the PARAMETERS: the hook receives the parameter, copy param.grad, not param": params,
             f"the SUM over ranks: divide by the world size ({world_size})": expected * world_size,
             "this rank's own gradient divided by the world size: the all-reduce had not finished when its buffer was "
             "copied back, so wait() on the work handle first": local / world_size,
             "this rank's own gradient: it was never averaged (a hook that all-reduces `param` instead of `param.grad` "
             "does this)": local}
    return next((f" They equal {name}." for name, value in wrong.items() if max_diff(got, value) <= TOL), "")


# ------------------------------------------------------------------------------------------------ question 4.1
def _assignment_cases():
    mlp = list(make_model(0).parameters())
    half = [torch.empty(n, dtype=torch.float16) for n in (100, 3, 50, 7, 64)]
    return [("the lab MLP, cap 400 B", mlp, CAP_BYTES), ("cap 1 B: every tensor alone", mlp, 1),
            ("cap 1 GB: one bucket", mlp, 10**9), ("four 16-byte tensors, cap 32 B", [torch.empty(4)] * 4, 32),
            ("float16 tensors (2 bytes each), cap 100 B", half, 100)]


def _wrong_assignments(params, cap):
    sizes = [nbytes(p) for p in params]
    n = len(params)
    forward = [[n - 1 - i for i in b] for b in reference_buckets(sizes[::-1], cap)]
    strict, current, filled = [], [], 0
    for index in reversed(range(n)):
        if current and filled + sizes[index] > cap:
            strict.append(current)
            current, filled = [], 0
        current.append(index)
        filled += sizes[index]
    strict += [current] if current else []
    return {"grouped from the FIRST parameter: gradients arrive last-layer first, so start from the last one": forward,
            "counted elements, not bytes: the cap is in bytes, p.numel() * p.element_size()":
                reference_buckets([p.numel() for p in params], cap),
            "kept every bucket under the cap: torch closes a bucket at the first tensor that takes it to >= cap "
            "(so a bucket may exceed the cap by part of one tensor)": strict}


@public_check("4.1")
def same_buckets_as_torch(ns):
    fn = answer(ns, "assign_buckets")
    for label, params, cap in _assignment_cases():
        expected = torch_buckets(params, cap) or reference_buckets([nbytes(p) for p in params], cap)
        got = fn(list(params), cap)
        try:
            got = [[int(i) for i in b] for b in got]
        except TypeError:
            raise AssertionError(f"{label}: expected a list of lists of parameter indices, got {got!r}") from None
        if got == expected:
            continue
        hint = next((f" You {name}." for name, wrong in _wrong_assignments(params, cap).items() if got == wrong), "")
        if not hint and sorted(map(sorted, got)) == sorted(map(sorted, expected)):
            hint = " Same buckets, another order: list buckets and the indices inside them in gradient-arrival order."
        raise AssertionError(f"{label} (sizes {[nbytes(p) for p in params]} bytes): expected {expected} "
                             f"(torch's _compute_bucket_assignment_by_size), got {got}.{hint}")


@public_check("4.1")
def every_parameter_exactly_once(ns):
    fn = answer(ns, "assign_buckets")
    params = [torch.empty(n) for n in (5, 300, 1, 1, 77, 12, 40)]
    got = fn(params, 64)
    seen = sorted(int(i) for b in got for i in b)
    assert seen == list(range(len(params))), (
        f"7 parameters: every index 0..6 must appear in exactly one bucket; the buckets hold {sorted(seen)}")
    assert all(len(b) for b in got), f"empty bucket in {got}"


# ------------------------------------------------------------------------------------------------ question 4.2
def _grad(shape, rank, index, step):
    """A gradient for parameter `index` on `rank` at `step`: different everywhere, reproducible here."""
    generator = torch.Generator().manual_seed(10_000 * step + 100 * index + rank)
    return torch.randn(shape, generator=generator)


def _on_ranks_bucket(Bucket, steps, slow_rank_s):
    """Fill one bucket (the MLP's last four tensors) for `steps` steps; report calls, timing and gradients."""
    rank, n = dist.get_rank(), dist.get_world_size()
    params = list(make_model(0).parameters())[::-1][:4]  # arrival order
    bucket = Bucket(params)
    report = []
    for step in range(steps):
        for i, p in enumerate(params):
            p.grad = _grad(p.shape, rank, i, step)
        with CommLedger() as ledger:
            for p in params[:-1]:
                bucket.add_grad(p)
            early = len(ledger.records)
            if slow_rank_s and rank == n - 1:
                time.sleep(slow_rank_s)  # the straggler: its last gradient comes late
            start = time.perf_counter()
            bucket.add_grad(params[-1])
            launch_s = time.perf_counter() - start
            launched = [(r.op, r.payload_bytes) for r in ledger.records[early:]]
            bucket.finish()
        report.append({"early": [(r.op, r.payload_bytes) for r in ledger.records[:early]], "launched": launched,
                       "after_finish": len(ledger.records) - early - len(launched), "launch_s": launch_s,
                       "grads": [p.grad.clone() for p in params]})
    return report


def _bucket_expected(step, world_size):
    params = list(make_model(0).parameters())[::-1][:4]
    local = [[_grad(p.shape, r, i, step) for i, p in enumerate(params)] for r in range(world_size)]
    mean = [sum(g[i] for g in local) / world_size for i in range(len(params))]
    return flat(mean), [flat(g) for g in local], flat([p.detach() for p in params])


def _check_bucket_report(report, world_size, ranks_to_check):
    bucket_bytes = sum(nbytes(p) for p in list(make_model(0).parameters())[-4:])
    where = f"world size {world_size}, one bucket of 4 tensors ({bucket_bytes} bytes)"
    for rank in ranks_to_check:
        for step, r in enumerate(report[rank]):
            at = f"{where}, rank {rank}, step {step + 1}"
            assert not r["early"], (
                f"{at}: add_grad issued {r['early']} before the bucket was full (3 of 4 gradients in): launch ONE "
                "all-reduce per bucket, when its last gradient arrives, not one per parameter")
            if step > 0 and not r["launched"]:
                raise AssertionError(f"{at}: the bucket did not launch its all-reduce again at the second step: reset "
                                     "pending (and work) in finish(), so that the bucket can be reused")
            assert len(r["launched"]) == 1 and r["launched"][0] == ("all_reduce", bucket_bytes), (
                f"{at}: expected one all_reduce of the whole flat buffer ({bucket_bytes} bytes) when the last gradient "
                f"arrived, got {r['launched']}")
            assert r["after_finish"] == 0, f"{at}: finish() issued {r['after_finish']} more collective(s): only wait"
            mean, local, params = _bucket_expected(step, world_size)
            got = flat(r["grads"])
            error = max_diff(got, mean)
            assert error <= TOL, (f"{at}: after finish(), max |p.grad - mean over ranks of the gradients| = "
                                  f"{error:.2e} (tolerance {TOL:.0e}).{diagnose(got, mean, local[rank], params, world_size)}")


@public_check("4.2")
def one_all_reduce_per_bucket_and_the_mean(ns):
    bucket_class = answer(ns, "Bucket")
    for world_size in (3, 2):
        report = run_on_ranks(_on_ranks_bucket, world_size, (bucket_class, 2, 0.0), "Bucket")
        _check_bucket_report(report, world_size, range(world_size))


@public_check("4.2")
def add_grad_does_not_wait_and_finish_does(ns):
    bucket_class = answer(ns, "Bucket")
    report = run_on_ranks(_on_ranks_bucket, 2, (bucket_class, 1, SLOW_RANK_S), "Bucket with a slow rank")
    launch_s = report[0][0]["launch_s"]
    assert launch_s < SLOW_RANK_S / 2, (
        f"rank 1 is {SLOW_RANK_S:g} s late: rank 0's add_grad of the last gradient took {launch_s:.2f} s, so it waited "
        "for the all-reduce. Launch it with async_op=True, keep the handle, and wait only in finish()")
    _check_bucket_report(report, 2, [0])


# ------------------------------------------------------------------------------------------------ question 4.3
def _on_ranks_reducer(Reducer, steps, slow_rank_s):
    """A Reducer on the MLP (different initial weights per rank); per step: calls, starts vs backward, gradients."""
    rank, n = dist.get_rank(), dist.get_world_size()
    model = make_model(100 + rank)
    reducer = Reducer(model, CAP_MB)  # broadcasts rank 0's parameters (given code)
    report = []
    for step in range(steps):
        model.zero_grad(set_to_none=True)
        x, y = rank_batch(step, rank)
        with CommLedger() as ledger:
            loss = F.mse_loss(model(x), y)
            if slow_rank_s and rank == n - 1:
                time.sleep(slow_rank_s)
            loss.backward()
            backward_end = time.perf_counter()
            reducer.finalize()
        starts = [r.start for r in ledger.records if r.op == "all_reduce"]
        report.append({"calls": len(starts), "during_backward": sum(s < backward_end for s in starts),
                       "others": sorted({r.op for r in ledger.records} - {"all_reduce"}),
                       "grads": [p.grad.clone() if p.grad is not None else None for p in model.parameters()]})
    return report


def _check_reducer_report(report, world_size, ranks_to_check):
    model = make_model(100)  # rank 0's weights, which the Reducer broadcast
    n_buckets = len(reference_buckets([nbytes(p) for p in model.parameters()], CAP_BYTES))
    params = flat([p.detach() for p in model.parameters()])
    where = f"world size {world_size}, the lab MLP with bucket_cap_mb = {CAP_BYTES} B / 2**20 ({n_buckets} buckets)"
    for rank in ranks_to_check:
        for step, r in enumerate(report[rank]):
            at = f"{where}, rank {rank}, step {step + 1}"
            assert not r["others"], f"{at}: during the step the Reducer also issued {r['others']}; only all-reduces"
            missing = [i for i, g in enumerate(r["grads"]) if g is None]
            assert not missing, f"{at}: p.grad is None for parameters {missing} after finalize()"
            local = [flat(local_grads(model, step, q)) for q in range(world_size)]
            mean = sum(local) / world_size
            got = flat(r["grads"])
            error = max_diff(got, mean)
            assert error <= TOL, (
                f"{at}: after finalize(), max |p.grad - mean over ranks of the gradients| = {error:.2e} "
                f"(tolerance {TOL:.0e}).{diagnose(got, mean, local[rank], params, world_size)} "
                f"({r['calls']} all-reduces in the step, {n_buckets} expected.)")
            if r["calls"] > n_buckets:
                raise AssertionError(f"{at}: {r['calls']} all-reduces in one step, expected {n_buckets}, one per "
                                     "bucket: too many messages (one per parameter, or a bucket launched twice?)")
            assert r["calls"] == n_buckets, (
                f"{at}: {r['calls']} all-reduces in one step, expected {n_buckets} (one per bucket)"
                + (": did finish() reset pending for the next step?" if step else ""))
            assert r["during_backward"] == n_buckets, (
                f"{at}: only {r['during_backward']} of the {n_buckets} all-reduces started before backward() returned: "
                "launch each bucket from the gradient hooks, during backward, not in finalize()")


@public_check("4.3")
def buckets_launched_during_backward_and_averaged(ns):
    reducer_class = answer(ns, "Reducer")
    report = run_on_ranks(_on_ranks_reducer, 3, (reducer_class, 2, 0.0), "Reducer")
    _check_reducer_report(report, 3, range(3))


@public_check("4.3")
def finalize_waits_for_a_slow_rank(ns):
    reducer_class = answer(ns, "Reducer")
    report = run_on_ranks(_on_ranks_reducer, 2, (reducer_class, 1, SLOW_RANK_S), "Reducer with a slow rank")
    _check_reducer_report(report, 2, [0])


# ------------------------------------------------------------------------------------------------ question 4.4
def _on_ranks_train(train_bucketed, steps, lr):
    """The student's loop and torch DDP on the same data; final parameters and all-reduces per run."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    rank = dist.get_rank()
    batches = [rank_batch(step, rank) for step in range(steps)]
    model = make_model(100 + rank)  # different initial weights: the Reducer's broadcast must fix that
    with CommLedger() as ledger:
        losses = train_bucketed(model, batches, lr, CAP_MB)
    calls = sum(r.op == "all_reduce" for r in ledger.records)
    ddp = DDP(make_model(100 + rank), bucket_cap_mb=CAP_MB)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=lr)
    for x, y in batches:
        optimizer.zero_grad(set_to_none=True)
        F.mse_loss(ddp(x), y).backward()
        optimizer.step()
    final = lambda m: flat([p.detach() for p in m.parameters()])
    return final(model), final(ddp), calls, losses


@public_check("4.4")
def training_equals_torch_ddp_on_2_and_3_ranks(ns):
    fn = answer(ns, "train_bucketed")
    steps, lr, tol = int(ns.get("STEPS", STEPS)), float(ns.get("LR", LR)), float(ns.get("TOL", TOL))
    n_buckets = len(reference_buckets([nbytes(p) for p in make_model(0).parameters()], CAP_BYTES))
    start = flat([p.detach() for p in make_model(100).parameters()])
    for world_size in (2, 3):
        results = run_on_ranks(_on_ranks_train, world_size, (fn, steps, lr), "train_bucketed")
        where = f"{world_size} ranks with different data, {steps} SGD steps (lr {lr})"
        ours = results[0][0]
        for rank, (params, _, calls, losses) in enumerate(results):
            assert torch.equal(params, ours), (
                f"{where}: rank {rank}'s parameters differ from rank 0's by {max_diff(params, ours):.2e}: the ranks "
                "stepped with different gradients. Does every step call reducer.finalize() BEFORE optimizer.step()?")
            assert calls == steps * n_buckets, (
                f"{where}: rank {rank} issued {calls} all-reduces, expected {steps * n_buckets} ({n_buckets} buckets x "
                f"{steps} steps). Build ONE Reducer before the loop (each Reducer registers its own hooks)")
            assert isinstance(losses, (list, tuple)) and len(losses) == steps, (
                f"{where}: train_bucketed should return {steps} losses (one per step), got {losses!r}")
        assert max_diff(ours, start) > 0, f"{where}: the parameters never changed"
        error = max_diff(ours, results[0][1])
        assert error <= tol, (f"{where}: identical on every rank, but max |parameters - torch DDP| = {error:.2e} "
                              f"(tolerance {tol:.0e})")
