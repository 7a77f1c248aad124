"""Shared pieces of lab 12's checks: world size, tolerance, the memoized launcher, the scale a scaler holds."""
import torch

from helpers.grading.shared_run import SharedRun, launch_on_gloo

WORLD_SIZE = 3  # odd: 12.2's flat parameter needs padding, and three ranks see three different batches
HANG_S = 20.0  # a check whose ranks wait longer than this reports CollectiveHang instead of hanging
# float32 parameters of size about 1 after a few SGD steps: the same sums in another order differ by a few roundings
# of 2**-24 (about 6e-8); 1e-6 allows that and is far below any real bug (chapter 03, section 6). A loss scaler that
# takes GradScaler's decisions multiplies by the same powers of two, so in fact the runs agree bit for bit.
TOL = 1e-6

_memoized = SharedRun()  # one run serves every check of a question

# Added to every seed of the checks' models, data and injected overflows: 0 here. The grader's hidden tests run the
# same functions with it set from their secret seed, and the checks themselves on their results with the same value
# (in the grader: probes/judges.by_public_checks), so the feedback says what the check says.
OFFSET = 0


def _launch(fn, *args, hint=""):
    """Run fn on WORLD_SIZE Gloo ranks; a hang or a dead rank becomes a failure that says what to look at."""
    return launch_on_gloo(fn, WORLD_SIZE, args, HANG_S, hint)


def scale_of(scaler):
    """The loss scale a scaler holds now: GradScaler's get_scale(), or the lab's LossScaler.scale_factor."""
    return scaler.get_scale() if hasattr(scaler, "get_scale") else float(scaler.scale_factor)


def flat(tensors):
    return torch.cat([t.detach().reshape(-1).cpu() for t in tensors])


def max_diff(a, b):
    return (a.double() - b.double()).abs().max().item()


def record_scales(scaler):
    """Wrap scaler.update (on the instance) to append the scale used by each step to the returned list."""
    used, update = [], scaler.update

    def recorded(*args, **kwargs):
        used.append(scale_of(scaler))
        return update(*args, **kwargs)

    scaler.update = recorded
    return used


def first_mismatch(mine, theirs):
    """The first index where two sequences differ (a length counts), or None."""
    for index, (a, b) in enumerate(zip(mine, theirs)):
        if a != b:
            return index
    return None if len(mine) == len(theirs) else min(len(mine), len(theirs))


_failures = {}  # message -> its AssertionError, so that check() prints a failure several checks share once


def shared_failure(message):
    """One AssertionError per message: the checks that all fail on one raised part of a run raise the same object,
    which check() prints once, followed by the checks it kept from running."""
    if len(_failures) > 100:
        _failures.clear()
    return _failures.setdefault(message, AssertionError(message))
