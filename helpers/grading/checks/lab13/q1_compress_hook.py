"""Checks of lab 13.1: compress_hook, a bucket sent as fp16 or bf16, with error feedback.

Without error feedback the hook must be PyTorch's default_hooks.fp16_compress_hook and bf16_compress_hook, bit for
bit, and send half the bytes; with it, the residual of every step must be the reference's: what this rank's cast lost.
"""
import torch

from helpers.grading.checks.lab13 import common
from helpers.grading.checks.lab13.common import (
    TOL,
    WORLD_SIZE,
    _launch,
    _memoized,
    compress_state,
    flat,
    max_diff,
    reference_compress_hook,
    train_ddp,
)
from helpers.grading.registry import answer, public_check
from helpers.grading.shared_run import definitions, part_or_error

STEPS = 4
DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16}
FEEDBACK_DTYPE = "bfloat16"  # 8 significant bits: the residual is large enough to matter
# The usual wrong versions, run on the same ranks and batches; a wrong answer is named by the one it equals.
WRONG_CASTS = {  # without error feedback
    "no division": "the SUM over ranks: divide the 16-bit copy by the world size ({w}) before the all-reduce",
    "divided after": ("the division came after the all-reduce: divide the 16-bit copy before it, as "
                      "fp16_compress_hook does (a sum of fp16 gradients can pass 65504)"),
}
WRONG_FEEDBACK = {
    "residual never updated": ("the residual was stored once and never updated: after every cast, replace "
                               "state.residuals[bucket.index()] with what this cast lost"),
    "residual added twice": ("the old residual was counted twice: the new residual is buffer - world x the 16-bit "
                             "copy (the buffer already holds the old one); assign it, do not add it to the old"),
    "residual without the world size": ("the residual is buffer - the 16-bit copy: the copy was divided by the world "
                                        "size, multiply it back: buffer - world x the 16-bit copy"),
    "residual of the mean": ("the residual was taken from the averaged result: keep what THIS rank's cast lost, "
                             "buffer - world x the 16-bit copy, computed before the all-reduce"),
    "from the first backward": ("the residual of the first backward was added to a rebuilt bucket: DDP rebuilds its "
                                "buckets after the first backward (another order), so start error feedback when "
                                "state.iter >= 1 and count backward passes with bucket.is_last()"),
}
HINT = "Every rank's hook must all-reduce each bucket once, at every step. "


def _torch_bf16(state, bucket):
    """PyTorch's bf16_compress_hook under another name: register_comm_hook refuses it by name unless torch has CUDA
    and NCCL 2.10 (_check_comm_hook), but the hook itself runs on Gloo, as chapter 13's bf16_hook does."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    return default_hooks.bf16_compress_hook(state, bucket)


def _wrong(mistake):
    def hook(state, bucket):
        return reference_compress_hook(state, bucket, mistake)
    return hook


def _feedback_run(hook):
    """A run with error feedback: the parameters, and after each step the residual of bucket 0 (or None)."""
    state, residuals = compress_state(DTYPES[FEEDBACK_DTYPE], True), []

    def snapshot(step):
        kept = getattr(state, "residuals", {}).get(0)
        residuals.append(kept.detach().clone().cpu() if isinstance(kept, torch.Tensor) else None)

    run = train_ddp(hook, state, STEPS, after_step=snapshot)
    return {**run, "residuals": residuals}


def _on_rank(compress_hook):
    """Runs on every rank: the student's hook with and without error feedback, PyTorch's, and the wrong versions."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    torch_hooks = {"float16": default_hooks.fp16_compress_hook, "bfloat16": _torch_bf16}
    out = {"init": flat(common.make_model().parameters())}
    for name, dtype in DTYPES.items():
        out[name] = part_or_error(lambda: train_ddp(compress_hook, compress_state(dtype, False), STEPS))
        out[f"torch {name}"] = train_ddp(torch_hooks[name], None, STEPS)["params"]
    out["first step"] = part_or_error(lambda: train_ddp(compress_hook, compress_state(torch.float16, False), 1))
    out["torch first step"] = train_ddp(default_hooks.fp16_compress_hook, None, 1)["params"]
    for mistake in WRONG_CASTS:
        out[mistake] = train_ddp(_wrong(mistake), compress_state(torch.float16, False), STEPS)["params"]
    out["feedback"] = part_or_error(_feedback_run, compress_hook)
    out["reference feedback"] = _feedback_run(reference_compress_hook)
    for mistake in WRONG_FEEDBACK:
        out[mistake] = _feedback_run(_wrong(mistake))
    return out


def _results(ns):
    hook = answer(ns, "compress_hook")
    return _memoized("13.1", definitions(ns), lambda: _launch(_on_rank, hook, hint=HINT))


def _run(result, key):
    """The student's run `key` of one rank, or a failure naming what the hook did."""
    run = result[key]
    if isinstance(run, dict) and "error" in run:
        error = run["error"]
        if "Future" in error or "future" in error:
            raise AssertionError(f"DDP refused what the hook returned ({error.splitlines()[0][:160]}): return the "
                                 "Future of the all-reduce, dist.all_reduce(..., async_op=True).get_future()"
                                 ".then(decompress), where decompress copies the result into the bucket's buffer "
                                 "and returns it")
        raise AssertionError(f"the hook raised {error.splitlines()[0][:200]}")
    return run


def _divisor(result):
    """The number the student's first step divided the sum by, from the size of the update against PyTorch's."""
    mine = _run(result, "first step")["params"] - result["init"]
    theirs = result["torch first step"] - result["init"]
    return WORLD_SIZE * theirs.norm().item() / max(mine.norm().item(), 1e-30)


@public_check("13.1")
def sixteen_bits_on_the_wire(ns):
    result = _results(ns)[0]
    full = 4 * common.numel()
    for name in DTYPES:
        for step, calls in enumerate(_run(result, name)["all_reduces"]):
            assert len(calls) == 1, (f"{name}, step {step}: {len(calls)} all-reduces of one bucket; expected one: "
                                     "all-reduce the 16-bit copy of bucket.buffer() once")
            (dtype, size), = calls
            assert dtype == name and size == full // 2, (
                f"{name}, step {step}: the bucket went over the wire as {dtype}, {size} bytes; expected {name}, "
                f"{full // 2} bytes (half of float32's {full}): all-reduce buffer.to(state.dtype), not the buffer")


@public_check("13.1")
def equal_to_torch_without_error_feedback(ns):
    result = _results(ns)[0]
    for name in DTYPES:
        diff = max_diff(_run(result, name)["params"], result[f"torch {name}"])
        if diff == 0:
            continue
        divisor = _divisor(result)
        if abs(divisor - round(divisor)) < 0.05 and round(divisor) != WORLD_SIZE:
            k = round(divisor)
            raise AssertionError(WRONG_CASTS["no division"].format(w=WORLD_SIZE) if k == 1 else
                                 f"the sum was divided by {k}, not by the world size ({WORLD_SIZE}): divide by "
                                 "dist.get_world_size()")
        for mistake, why in WRONG_CASTS.items():
            if name == "float16" and max_diff(_run(result, name)["params"], result[mistake]) == 0:
                raise AssertionError(why.format(w=WORLD_SIZE))
        raise AssertionError(
            f"with error_feedback=False and {name}, the parameters after {STEPS} steps differ from PyTorch's "
            f"{'fp16' if name == 'float16' else 'bf16'}_compress_hook's by {diff:.3g}; they must be equal: cast the "
            "buffer to state.dtype, divide the 16-bit copy by the world size, all-reduce it, copy the result back "
            "into the buffer")


@public_check("13.1")
def identical_on_every_rank(ns):
    results = _results(ns)
    for rank in range(1, WORLD_SIZE):
        diff = max_diff(_run(results[rank], "feedback")["params"], _run(results[0], "feedback")["params"])
        assert diff == 0, (f"with error feedback, rank {rank}'s parameters differ from rank 0's by {diff:.3g}: every "
                           "rank must copy the same all-reduced result into its bucket; the residual changes what "
                           "a rank sends, never what it receives")


def _same(a, b):
    """Two residuals equal within float32 rounding (the same terms summed in another order), or both absent."""
    if a is None or b is None:
        return a is None and b is None
    return a.shape == b.shape and max_diff(a, b) <= TOL


@public_check("13.1")
def error_feedback_residual(ns):
    for rank, result in enumerate(_results(ns)):
        mine, right = _run(result, "feedback")["residuals"], result["reference feedback"]["residuals"]
        for step, (got, want) in enumerate(zip(mine, right)):
            if _same(got, want):
                continue
            for mistake, why in WRONG_FEEDBACK.items():
                if all(_same(a, b) for a, b in zip(mine, result[mistake]["residuals"])):
                    raise AssertionError(why)
            if want is None:
                raise AssertionError(f"rank {rank} kept a residual after the first backward: DDP rebuilds its "
                                     "buckets after it; start error feedback when state.iter >= 1")
            if got is None:
                raise AssertionError(f"rank {rank}: state.residuals[0] is empty after step {step}: store what the "
                                     "cast lost, state.residuals[bucket.index()] = buffer - world x the 16-bit copy")
            raise AssertionError(f"rank {rank}: the residual after step {step} differs from what the cast lost by up "
                                 f"to {max_diff(got, want) if got.shape == want.shape else 'a shape'}: add the old "
                                 "residual to the buffer first, then keep buffer - world x the 16-bit copy")


@public_check("13.1")
def error_feedback_changes_the_next_step(ns):
    result = _results(ns)[0]
    diff = max_diff(_run(result, "feedback")["params"], result["reference feedback"]["params"])
    assert diff <= TOL, (f"with error feedback the parameters after {STEPS} steps differ from the reference's by "
                       f"{diff:.3g}, though the residuals are right: add state.residuals[bucket.index()] to the "
                       "buffer before the cast, from the second backward on")
