"""Checks of lab 13.2: powersgd_hook, rank-r PowerSGD with error feedback and warm start.

Its bytes per step must be what the shapes predict, (n + m) r numbers per compressed matrix (the ledger counts them),
its first compressed step the projection of the averaged gradient onto the columns of P (what an orthonormal P and a
mean Q give), and its parameters PyTorch's powerSGD_hook's within float32 rounding (TOL), on 3 ranks with different
data. No reference hook: PyTorch's, with error feedback or warm start turned off, names those two mistakes.
"""

import math

from helpers.grading.checks.lab13 import common
from helpers.grading.checks.lab13.common import (
    PSGD_RANK,
    PSGD_START,
    TOL,
    WORLD_SIZE,
    _launch,
    _memoized,
    max_diff,
    powersgd_state,
    train_ddp,
    worth_compressing,
)
from helpers.grading.registry import answer, public_check
from helpers.grading.shared_run import definitions, part_or_error

STEPS = 6  # PSGD_START plain steps, then 4 compressed ones
WRONG = {  # PyTorch's hook with one switch turned off, and the mistake a run equal to it shows
    "no error feedback": ("error feedback is missing: add state.errors[bucket.index()] to the buffer first, and keep "
                          "what the approximation left out, state.errors[i] = the buffer before - the buffer after"),
    "no warm start": ("new random Qs at every step: draw them only for a bucket that has none yet, and keep "
                      "Q = Mᵀ P in state.qs[i] for the next step (the warm start)"),
}
NOT_ORTHOGONAL = ("P was not orthogonalised after its all-reduce: without it P Qᵀ = P Pᵀ M is not the projection of M "
                  "onto P's columns and its scale is |P|², which nothing bounds; call orthogonalize(p) on every P "
                  "before Q = Mᵀ P")
Q_SUMMED = (f"the SUM of the Qs over ranks: divide the all-reduced Qs by the world size ({WORLD_SIZE}) "
            "(copy_flat(..., world) in the last callback); P needs no division: orthogonalize removes its scale")
FIRST_STEP = ("the buckets were compressed from the first backward: DDP rebuilds them after it (another order), so the "
              "first state.start_iter backward passes are plain all-reduces (allreduce_mean_hook); count them with "
              "bucket.is_last()")
HINT = "Every rank's hook must issue the same all-reduces, in the same order, at every step. "


def _shapes():
    """(n, m) of every parameter viewed as shape[0] x the rest, in the model's order."""
    return [(p.shape[0], p.numel() // p.shape[0]) for p in common.make_model().parameters()]


def predicted_bytes():
    """(bytes of a plain step, bytes of a compressed step: the uncompressed tensors, the Ps, the Qs)."""
    shapes = _shapes()
    compressed = [(n, m) for n, m in shapes if worth_compressing(n, m)]
    plain = sum(n * m for n, m in shapes)
    uncompressed = sum(n * m for n, m in shapes if not worth_compressing(n, m))
    return 4 * plain, (4 * uncompressed, 4 * sum(n * PSGD_RANK for n, _ in compressed),
                       4 * sum(m * PSGD_RANK for _, m in compressed))


def _spied(hook, steps):
    """The student's run, and at the first compressed backward what the hook received (the gradient, flat), the shapes
    of its gradients in the bucket's order, and the flat buffer it returned."""
    seen = {"calls": 0}

    def spy(state, bucket):  # DDP checks the names of a hook's parameters: (state, bucket)
        backward = seen["calls"]
        seen["calls"] += bucket.is_last()
        if backward != PSGD_START:
            return hook(state, bucket)
        received = bucket.buffer().detach().clone()
        shapes = [tuple(g.shape) for g in bucket.gradients()]
        returned = hook(state, bucket)
        if not hasattr(returned, "then"):
            return returned  # DDP refuses it, with its own message

        def keep(fut):
            value = fut.value()
            seen["first compressed"] = {"received": received, "shapes": shapes,
                                        "returned": (value[0] if isinstance(value, list) else value).detach().clone()}
            return value

        return returned.then(keep)

    run = train_ddp(spy, powersgd_state(), steps)
    return {**run, "first compressed": seen.get("first compressed")}


def _on_rank(powersgd_hook):
    """Runs on every rank: the student's hook, PyTorch's powerSGD_hook, and PyTorch's without error feedback or warm
    start, on the same batches."""
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as psgd

    def theirs(error_feedback=True, warm_start=True):
        state = psgd.PowerSGDState(None, matrix_approximation_rank=PSGD_RANK, start_powerSGD_iter=PSGD_START,
                                   use_error_feedback=error_feedback, warm_start=warm_start)
        return train_ddp(psgd.powerSGD_hook, state, STEPS)

    return {"mine": part_or_error(_spied, powersgd_hook, STEPS), "torch": theirs(),
            "no error feedback": theirs(error_feedback=False)["params"],
            "no warm start": theirs(warm_start=False)["params"]}


def _results(ns):
    hook = answer(ns, "powersgd_hook")
    return _memoized("13.2", definitions(ns), lambda: _launch(_on_rank, hook, hint=HINT))


def _mine(result):
    run = result["mine"]
    if isinstance(run, dict) and "error" in run:
        error = run["error"]
        if "cannot be multiplied" in error or "must match the size" in error or "shape" in error:
            raise AssertionError(f"{FIRST_STEP} (the hook raised {error.splitlines()[0][:120]})")
        if "Future" in error:
            raise AssertionError(f"DDP refused what the hook returned ({error.splitlines()[0][:120]}): return "
                                 "the Future of all_reduce_flat(Ps), chained with .then, whose last callback returns "
                                 "the buffer")
        raise AssertionError(f"the hook raised {error.splitlines()[0][:200]}")
    return run


@public_check("13.2")
def bytes_per_step_from_the_shapes(ns):
    plain, parts = predicted_bytes()
    compressed = sum(parts)
    for step, calls in enumerate(_mine(_results(ns)[0])["all_reduces"]):
        sent = sum(size for _, size in calls)
        want = plain if step < PSGD_START else compressed
        if sent == want:
            continue
        if step < PSGD_START:
            raise AssertionError(f"step {step} all-reduced {sent} bytes, not the plain {plain}: {FIRST_STEP}")
        if sent == plain:
            raise AssertionError(f"step {step} all-reduced {sent} bytes, all of the gradients: nothing was "
                                 f"compressed; from step {PSGD_START} on, send P and Q ({compressed} bytes)")
        shapes = [(n, m) for n, m in _shapes() if worth_compressing(n, m)]
        raise AssertionError(
            f"step {step} all-reduced {sent} bytes; the shapes predict {compressed} = {parts[0]} (the tensors not "
            f"worth compressing, whole) + {parts[1]} (P, n x r) + {parts[2]} (Q, m x r), at r = {PSGD_RANK} for "
            f"the matrices {shapes}: (n + m) r numbers each, and split_for_compression decides which")


@public_check("13.2")
def identical_on_every_rank(ns):
    results = _results(ns)
    for rank in range(1, WORLD_SIZE):
        diff = max_diff(_mine(results[rank])["params"], _mine(results[0])["params"])
        assert diff == 0, (f"rank {rank}'s parameters differ from rank 0's by {diff:.3g}: every rank must write the "
                           "same approximation P Qᵀ of the averaged gradient (from the all-reduced P and Q) into its "
                           "bucket; the error memory changes what a rank sends, never what it receives")


def _distance(a, b):
    """max |a - b|, infinite where either holds an inf or a NaN (a diverged run)."""
    diff = max_diff(a, b)
    return diff if diff == diff else float("inf")


@public_check("13.2")
def first_compressed_step_is_a_projection(ns):
    """With P orthonormal and Q = the mean of Mᵀ P, P Qᵀ = P Pᵀ M̄ projects the mean gradient M̄ onto P's columns:
    <P Qᵀ, M̄> = |P Qᵀ|² (no error memory yet at the first compressed step: M̄ is the mean of what the hooks got)."""
    results = _results(ns)
    records = [_mine(result)["first compressed"] for result in results]
    assert all(records), (f"the hook returned no future at backward {PSGD_START}, the first compressed one: return "
                          "the chained future of all_reduce_flat(Ps)")
    mean = sum(r["received"] for r in records) / WORLD_SIZE
    sizes = [math.prod(shape) for shape in records[0]["shapes"]]
    for shape, approx, grad in zip(records[0]["shapes"], records[0]["returned"].split(sizes), mean.split(sizes)):
        n, m = shape[0], approx.numel() // shape[0]
        if not worth_compressing(n, m):
            continue
        square, inner = approx.double().square().sum().item(), (approx.double() @ grad.double()).item()
        if abs(inner - square) <= 1e-4 * square:
            continue
        if abs(inner * WORLD_SIZE - square) <= 1e-3 * square:
            raise AssertionError(Q_SUMMED)
        raise AssertionError(f"the {n} x {m} matrix written at the first compressed step is not the projection of the "
                             f"mean gradient onto P's columns (<P Qᵀ, M> = {inner:.3g}, |P Qᵀ|² = {square:.3g}): "
                             + NOT_ORTHOGONAL)


@public_check("13.2")
def agrees_with_powerSGD_hook(ns):
    result = _results(ns)[0]
    mine = _mine(result)["params"]
    diff = _distance(mine, result["torch"]["params"])
    if diff <= TOL:
        return
    for mistake, why in WRONG.items():
        if _distance(mine, result[mistake]) <= TOL:
            raise AssertionError(why)
    raise AssertionError(f"after {STEPS} steps the parameters differ from powerSGD_hook's by {diff:.3g} (tolerance "
                         f"{TOL:g}: float32 rounding): orthogonalize the Qs, P = M Q, all-reduce the Ps, orthogonalize "
                         "them, Q = Mᵀ P, all-reduce the Qs, / world, write P Qᵀ into each matrix")
