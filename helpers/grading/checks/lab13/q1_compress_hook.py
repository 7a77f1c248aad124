"""Checks of lab 13.1: compress_hook, a bucket sent as fp16 or bf16, with error feedback.

Without error feedback the hook must be PyTorch's default_hooks.fp16_compress_hook and bf16_compress_hook, bit for
bit, and send half the bytes; with it, the residual after every backward must be what this rank's cast lost, computed
from what the hook received (the gradient) and the residual it kept the step before. No reference hook: PyTorch's
hooks and that one-line rule are the references, and each usual wrong residual is named by the rule it follows.
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
    train_ddp,
)
from helpers.grading.registry import answer, public_check
from helpers.grading.shared_run import definitions, part_or_error

STEPS = 4
DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16}
FEEDBACK_DTYPE = "bfloat16"  # 8 significant bits: the residual is large enough to matter
SUM = "the SUM over ranks: divide the 16-bit copy by the world size ({w}) before the all-reduce"
ROUNDED = ("the mean is right but rounded differently from PyTorch's hook: cast the buffer to state.dtype first, then "
           "divide the 16-bit copy by the world size, before the all-reduce, as fp16_compress_hook does (dividing "
           "after the all-reduce lets a sum of fp16 gradients pass 65504)")
WRONG_FEEDBACK = {  # each usual wrong residual, and the mistake it shows
    "residual never updated": ("the residual was stored once and never updated: after every cast, replace "
                               "state.residuals[bucket.index()] with what this cast lost"),
    "residual added twice": ("the old residual was counted twice: the new residual is buffer - world x the 16-bit "
                             "copy (the buffer already holds the old one); assign it, do not add it to the old"),
    "residual not added": ("the residual kept at the step before was not added to the buffer before the cast: "
                           "buffer += state.residuals[i] first, then cast"),
    "residual without the world size": ("the residual is buffer - the 16-bit copy: the copy was divided by the world "
                                        "size, multiply it back: buffer - world x the 16-bit copy"),
    "residual of the mean": ("the residual was taken from the averaged result: keep what THIS rank's cast lost, "
                             "buffer - world x the 16-bit copy, computed before the all-reduce"),
}
FIRST_BACKWARD = ("a residual was kept at the first backward, and the residual of the first backward was added to a "
                  "rebuilt bucket: DDP rebuilds its buckets after the first backward (another order), so start error "
                  "feedback when state.iter >= 1 and count backward passes with bucket.is_last()")
HINT = "Every rank's hook must all-reduce each bucket once, at every step. "


def _torch_bf16(state, bucket):
    """PyTorch's bf16_compress_hook under another name: register_comm_hook refuses it by name unless torch has CUDA
    and NCCL 2.10 (_check_comm_hook), but the hook itself runs on Gloo, as chapter 13's bf16_hook does."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    return default_hooks.bf16_compress_hook(state, bucket)


def _feedback_run(hook):
    """A run with error feedback: the parameters, and at every backward what the hook received (the gradient), the
    residual of bucket 0 it kept (or None) and the mean it returned."""
    state, records = compress_state(DTYPES[FEEDBACK_DTYPE], True), []

    def spy(state, bucket):  # DDP checks the names of a hook's parameters: (state, bucket)
        received = bucket.buffer().detach().clone()
        returned = hook(state, bucket)
        if not hasattr(returned, "then"):
            return returned  # DDP refuses it, with its own message

        def keep(fut):
            value = fut.value()
            kept = getattr(state, "residuals", {}).get(0)
            records.append({"gradient": received,
                            "residual": kept.detach().clone() if isinstance(kept, torch.Tensor) else None,
                            "mean": (value[0] if isinstance(value, list) else value).detach().clone()})
            return value

        return returned.then(keep)

    return {**train_ddp(spy, state, STEPS), "records": records}


def _on_rank(compress_hook):
    """Runs on every rank: the student's hook with and without error feedback, and PyTorch's hooks."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    torch_hooks = {"float16": default_hooks.fp16_compress_hook, "bfloat16": _torch_bf16}
    out = {"init": flat(common.make_model().parameters())}
    for name, dtype in DTYPES.items():
        out[name] = part_or_error(lambda: train_ddp(compress_hook, compress_state(dtype, False), STEPS))
        out[f"torch {name}"] = train_ddp(torch_hooks[name], None, STEPS)["params"]
    out["first step"] = part_or_error(lambda: train_ddp(compress_hook, compress_state(torch.float16, False), 1))
    out["torch first step"] = train_ddp(default_hooks.fp16_compress_hook, None, 1)["params"]
    out["feedback"] = part_or_error(_feedback_run, compress_hook)
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


def cast_loss(kept, dtype):
    """What sending `kept` (float32) as dtype loses: kept minus world x (kept cast to dtype, divided by the world)."""
    copy = kept.to(dtype).div_(WORLD_SIZE)
    return kept - WORLD_SIZE * copy.float()


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
            raise AssertionError(SUM.format(w=WORLD_SIZE) if k == 1 else
                                 f"the sum was divided by {k}, not by the world size ({WORLD_SIZE}): divide by "
                                 "dist.get_world_size()")
        if abs(divisor - WORLD_SIZE) < 0.05:
            raise AssertionError(ROUNDED)
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


def _near(a, b):
    """Two float32 tensors equal within float32 rounding (the same terms summed in another order)."""
    return a is not None and b is not None and a.shape == b.shape and max_diff(a, b) <= TOL


def _residual_mistake(records, t):
    """The first failure of backward t's residual against the rule, as (mistake or None, message); None if right."""
    got, dtype = records[t]["residual"], DTYPES[FEEDBACK_DTYPE]
    if t == 0:
        return None if got is None else FIRST_BACKWARD
    if got is None:
        return (f"state.residuals[0] is empty after backward {t}: store what the cast lost, "
                "state.residuals[bucket.index()] = buffer - world x the 16-bit copy")
    before = records[t - 1]["residual"]
    before = torch.zeros_like(got) if before is None else before
    kept = records[t]["gradient"] + before  # what the buffer holds once the old residual is added
    if _near(got, cast_loss(kept, dtype)):
        return None
    wrong = {"residual not added": cast_loss(records[t]["gradient"], dtype),
             "residual never updated": before if t >= 2 else None,
             "residual added twice": before + cast_loss(kept, dtype),
             "residual without the world size": kept - kept.to(dtype).div_(WORLD_SIZE).float(),
             "residual of the mean": kept - records[t]["mean"]}
    for mistake, value in wrong.items():
        if _near(got, value) and not (mistake == "residual not added" and _near(before, torch.zeros_like(got))):
            return WRONG_FEEDBACK[mistake]
    return (f"the residual after backward {t} differs from what the cast lost by up to "
            f"{max_diff(got, cast_loss(kept, dtype)) if got.shape == kept.shape else 'a shape'}: add the old residual "
            "to the buffer first, then keep buffer - world x the 16-bit copy")


@public_check("13.1")
def error_feedback_residual(ns):
    for rank, result in enumerate(_results(ns)):
        records = _run(result, "feedback")["records"]
        assert len(records) == STEPS, (f"rank {rank}: the hook returned {len(records)} futures in {STEPS} backward "
                                       "passes with error feedback on; return one per bucket and backward")
        for t in range(STEPS):
            why = _residual_mistake(records, t)
            assert why is None, why if rank == 0 else f"rank {rank}: {why}"
