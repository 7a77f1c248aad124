"""Checks of lab 12.1: LossScaler, dynamic loss scaling that takes torch.amp.GradScaler's decisions step for step.

Both scalers run on the same stream of gradients, in this process (GradScaler("cpu") and its two ops,
_amp_foreach_non_finite_check_and_unscale_ and _amp_update_scale_, have CPU kernels in torch 2.13:
torch/amp/grad_scaler.py). The stream holds an inf, a NaN, and a finite gradient that overflows float32 once it is
scaled; the scale must shrink and grow as GradScaler's does, the same steps must be skipped, and the parameters must
end bit for bit equal.
"""
import torch
from torch import nn

from helpers.grading.checks.lab12 import common
from helpers.grading.checks.lab12.common import first_mismatch, max_diff, scale_of
from helpers.grading.registry import answer, public_check
from helpers.grading.shared_run import definitions, part_or_error

STEPS, LR, NUMEL = 16, 0.1, 6
# The stream's events, one per step ("" = clean); the NaN comes after a clean step (a growth counter that is not reset
# shows), the rest is rotated by the hidden tests' OFFSET. "big" is 1e38: finite, but
# inf once multiplied by any scale of 4 or more (float32's largest is 3.4e38).
PATTERN = ("inf", "", "nan", "", "", "", "", "big", "", "inf", "", "", "", "", "", "")


def settings():
    """(init_scale, growth_interval, events) of the stream: the check's own, or the hidden test's (OFFSET)."""
    shift = common.OFFSET % 3
    events = PATTERN[:3] + PATTERN[3 + shift:] + PATTERN[3:3 + shift]  # an inf, a clean step, a NaN; the rest rotated
    return 2.0 ** (8 + common.OFFSET % 5), 2 + common.OFFSET // 5 % 2, events


def _bases():
    """The unscaled gradient of every step, with the events injected."""
    g = torch.Generator().manual_seed(120 + common.OFFSET)
    bases = [torch.randn(NUMEL, generator=g) for _ in range(STEPS)]
    for base, event in zip(bases, settings()[2]):
        if event:
            base[1 + common.OFFSET % (NUMEL - 1)] = {"inf": float("inf"), "nan": float("nan"), "big": 1e38}[event]
    return bases


def _stream(scaler, explicit=False):
    """Every step: .grad = scaler.scale(that step's gradient), [unscale_], step, update. The scale each step used,
    whether it was skipped (the parameter did not move), the scale after the last update, and the final parameter."""
    torch.manual_seed(12 + common.OFFSET)
    p = nn.Parameter(torch.randn(NUMEL))
    optimizer = torch.optim.SGD([p], lr=LR)
    used, skipped = [], []
    for base in _bases():
        used.append(scale_of(scaler))
        before = p.detach().clone()
        p.grad = scaler.scale(base.clone())
        if explicit:
            scaler.unscale_(optimizer)
        scaler.step(optimizer)
        scaler.update()
        skipped.append(torch.equal(before, p.detach()))
    used.append(scale_of(scaler))  # the scale after the last update: a growth there counts too
    return {"used": used, "skipped": skipped, "param": p.detach().clone()}


def _second_unscale(scaler):
    """What a second unscale_ in one step does: the name of the exception it raised, or "returned"."""
    p = nn.Parameter(torch.ones(2))
    optimizer = torch.optim.SGD([p], lr=LR)
    p.grad = scaler.scale(torch.ones(2))
    scaler.unscale_(optimizer)
    try:
        scaler.unscale_(optimizer)
    except NotImplementedError:
        raise
    except Exception as exc:  # noqa: BLE001 - which exception is the question
        return type(exc).__name__
    return "returned"


def runs(cls):
    """The student's LossScaler and torch's GradScaler on the same streams (what every check of 12.1 reads)."""
    init_scale, interval, _ = settings()
    mine = {"stream": part_or_error(lambda: _stream(cls(init_scale, growth_interval=interval))),
            "explicit": part_or_error(lambda: _stream(cls(init_scale, growth_interval=interval), explicit=True)),
            "second unscale": part_or_error(lambda: _second_unscale(cls(init_scale, growth_interval=interval)))}
    theirs = {"stream": _stream(torch.amp.GradScaler("cpu", init_scale=init_scale, growth_interval=interval)),
              "explicit": _stream(torch.amp.GradScaler("cpu", init_scale=init_scale, growth_interval=interval),
                                  explicit=True)}
    return {"mine": mine, "torch": theirs}


def _results(ns):
    cls = answer(ns, "LossScaler")
    return common._memoized("12.1", definitions(ns), lambda: runs(cls))


def _mine(results, part, what):
    """The student's run of one part; one that raised fails the check with the error."""
    got = results["mine"][part]
    if isinstance(got, dict) and "error" in got:
        again = " update() must set found_inf back to None," if "already been called" in got["error"] else ""
        raise common.shared_failure(f"{what} raised {got['error']}:{again or ' run it yourself to see where'} (the "
                                    f"check runs, per step: .grad = scaler.scale(g), {what})")
    return got


# --- the diagnosis: the usual wrong schedules, simulated on GradScaler's own skips ------------------------------

def _schedule(skipped, init_scale, interval, variant=""):
    """The scale each step uses, given which steps found an inf: GradScaler's rule, or a usual wrong one."""
    scale, tracker, used = init_scale, 0, []
    for found in skipped:
        used.append(scale)
        if found:
            scale *= 1.0 if variant == "no backoff" else 0.5
            tracker = tracker if variant == "no reset on overflow" else 0
            continue
        tracker += 1
        if tracker == {"late": interval + 1, "early": interval - 1}.get(variant, interval) and variant != "no growth":
            scale *= 2.0
            tracker = tracker if variant == "no reset after growth" else 0
    return used + [scale]


WRONG_SCHEDULES = {
    "no reset on overflow": "the growth counter is not reset on overflow: after a step with an inf or a NaN, set "
                            "growth_tracker = 0 (clean steps must be IN A ROW, as GradScaler's _amp_update_scale_ "
                            "counts them)",
    "no reset after growth": "the growth counter is not reset when the scale grows: set growth_tracker = 0 after "
                             "multiplying the scale by growth_factor",
    "late": "the scale grows one clean step late: count the step first (growth_tracker += 1), then grow when it "
            "equals growth_interval",
    "early": "the scale grows one clean step early: grow after growth_interval clean steps in a row, not one before",
    "no backoff": "the scale does not shrink after a skipped step: multiply it by backoff_factor",
    "no growth": "the scale never grows: after growth_interval clean steps in a row, multiply it by growth_factor",
}


def _wrong_skip(step, event, mine):
    if event == "nan" and not mine:
        return (f"step {step}'s gradient holds a NaN and the step was not skipped: test every gradient with "
                "torch.isfinite (a NaN is not an inf: NaN == inf is False, and so is NaN > 65504)")
    if event and not mine:
        return (f"step {step}'s gradient holds an inf{' once scaled' if event == 'big' else ''} and the step was not "
                "skipped: found_inf must be True when any .grad holds an inf or a NaN")
    return (f"step {step}'s gradients are finite and the step was skipped: found_inf is True only when a .grad holds "
            "an inf or a NaN")


@public_check("12.1")
def skips_the_steps_gradscaler_skips(ns):
    results = _results(ns)
    mine, theirs = _mine(results, "stream", "step, update")["skipped"], results["torch"]["stream"]["skipped"]
    step = first_mismatch(mine, theirs)
    if step is None:
        return
    if len(set(mine)) == 1 and len(set(theirs)) > 1 and mine[0] == theirs[0]:
        raise AssertionError("every step repeats step 0's decision: update() must set found_inf back to None, so "
                             "that the next step() unscales its own gradients and decides again")
    raise AssertionError(_wrong_skip(step, settings()[2][step], mine[step]) +
                         f". Skipped steps: yours {[i for i, s in enumerate(mine) if s]}, GradScaler's "
                         f"{[i for i, s in enumerate(theirs) if s]}")


@public_check("12.1")
def scales_like_gradscaler(ns):
    results = _results(ns)
    mine, theirs = _mine(results, "stream", "step, update"), results["torch"]["stream"]
    if mine["skipped"] != theirs["skipped"]:
        raise AssertionError("not compared: the skipped steps differ from GradScaler's (see the check above)")
    step = first_mismatch(mine["used"], theirs["used"])
    if step is None:
        return
    init_scale, interval, _ = settings()
    for variant, why in WRONG_SCHEDULES.items():
        if _schedule(theirs["skipped"], init_scale, interval, variant) == list(mine["used"]):
            raise AssertionError(f"{why} (growth_interval={interval}; step {step} used scale {mine['used'][step]:g}, "
                                 f"GradScaler's {theirs['used'][step]:g})")
    raise AssertionError(f"step {step} used scale {mine['used'][step]:g}, GradScaler's {theirs['used'][step]:g} "
                         f"(skipped steps {[i for i, s in enumerate(theirs['skipped']) if s]}, growth_interval="
                         f"{interval}): shrink by backoff_factor after a skipped step, grow by growth_factor after "
                         "growth_interval clean steps in a row")


def _param_failure(mine, theirs, what):
    diff = max_diff(mine["param"], theirs["param"])
    if diff <= common.TOL:
        return None
    if mine["param"].isnan().any():
        return f"{what}: the parameter became NaN: a step with a NaN or inf gradient was taken"
    return (f"{what}: the parameter differs from GradScaler's by {diff:.3g} although the same steps were taken: "
            "multiply every .grad by 1/S exactly once per step (1/S computed in float64, then float32)")


@public_check("12.1")
def parameters_equal_gradscalers(ns):
    results = _results(ns)
    why = _param_failure(_mine(results, "stream", "step, update"), results["torch"]["stream"], "scale, step, update")
    assert why is None, why


@public_check("12.1")
def unscale_then_step_unscales_once(ns):
    """unscale_ first (to clip the true gradients), then step: step() must not divide again."""
    results = _results(ns)
    mine, theirs = _mine(results, "explicit", "unscale_, step, update"), results["torch"]["explicit"]
    stream = _mine(results, "stream", "step, update")
    if mine["skipped"] == theirs["skipped"] and max_diff(mine["param"], theirs["param"]) > common.TOL \
            and stream["skipped"] == results["torch"]["stream"]["skipped"]:
        raise AssertionError("with unscale_ called before step, the gradients were divided by the scale twice: "
                             "unscale_ must set found_inf (True or False, not None), and step() then does not "
                             "unscale again")
    why = _param_failure(mine, theirs, "unscale_, step, update") or (
        None if mine["skipped"] == theirs["skipped"] else
        f"unscale_, step, update: skipped steps {[i for i, s in enumerate(mine['skipped']) if s]}, GradScaler's "
        f"{[i for i, s in enumerate(theirs['skipped']) if s]}")
    assert why is None, why


@public_check("12.1")
def a_second_unscale_is_refused(ns):
    got = _mine(_results(ns), "second unscale", "unscale_, unscale_")
    assert got == "RuntimeError", (
        f"a second unscale_() in the same step {'returned' if got == 'returned' else 'raised ' + got}: raise "
        "RuntimeError (GradScaler: 'unscale_() has already been called on this optimizer since the last update()'),"
        " or the gradients are divided twice")
