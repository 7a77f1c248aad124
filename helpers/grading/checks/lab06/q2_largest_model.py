"""Checks of lab 6.2: largest_model inverts the model-state formula exactly; the paper's numbers, reserved bytes."""
import math
from fractions import Fraction
from numbers import Integral

from helpers.grading.checks.lab06.common import CONVENTIONS
from helpers.grading.registry import answer, public_check

# --- 6.2 largest_model --------------------------------------------------------------------------

def _exact_largest(memory_bytes, world_size, stage, reserved_bytes=0, convention=(2, 2, 12)):
    """floor((memory - reserved) / bytes per parameter per device), in exact rational arithmetic; >= 0."""
    p, g, k = (Fraction(b) for b in convention)
    n = Fraction(world_size)
    per_param = (p / n if stage >= 3 else p) + (g / n if stage >= 2 else g) + (k / n if stage >= 1 else k)
    free = Fraction(memory_bytes) - Fraction(reserved_bytes)
    return max(0, math.floor(free / per_param))


def _compare_6_2(fn, memory_bytes, world_size, stage, reserved_bytes=0, convention=None):
    kwargs = {"reserved_bytes": reserved_bytes} if reserved_bytes else {}
    if convention is not None:
        kwargs.update(param_bytes=convention[0], grad_bytes=convention[1], optimizer_bytes=convention[2])
    call = f"largest_model({memory_bytes:g}, {world_size}, {stage}" + "".join(
        f", {k}={v:g}" for k, v in kwargs.items()) + ")"
    got = fn(memory_bytes, world_size, stage, **kwargs)
    assert isinstance(got, Integral) and not isinstance(got, bool), (
        f"{call} returned {got!r} ({type(got).__name__}); return an int: a whole number of parameters")
    expected = _exact_largest(memory_bytes, world_size, stage, reserved_bytes, convention or (2, 2, 12))
    if abs(int(got) - expected) > 1:
        ignored = reserved_bytes and abs(int(got) - _exact_largest(memory_bytes, world_size, stage, 0,
                                                                   convention or (2, 2, 12))) <= 1
        default = convention and abs(int(got) - _exact_largest(memory_bytes, world_size, stage, reserved_bytes)) <= 1
        hint = ("; the reserved bytes are not available for model states: subtract reserved_bytes from memory_bytes "
                "first" if ignored else "; it is the answer for the default 2 + 2 + 12 bytes: pass param_bytes, "
                "grad_bytes and optimizer_bytes on" if default else "")
        raise AssertionError(f"{call} = {int(got)}; expected {expected} (exact up to 1 parameter of rounding){hint}")
    return int(got)


@public_check("6.2")
def section_5_4_of_the_zero_paper(ns):
    """32 GB at Nd = 64: ZeRO-1 >= 7.5B, ZeRO-2 >= 14B, ZeRO-3 = 128B; Nd = 1024: >= 1T; GPT-2 1.5B = 24 GB."""
    fn = answer(ns, "largest_model")
    for stage, quoted in ((1, 7.5e9), (2, 14e9), (3, 128e9)):
        got = _compare_6_2(fn, 32e9, 64, stage)
        assert got >= quoted, f"largest_model(32e9, 64, {stage}) = {got}, below the paper's {quoted:g}"
    assert _compare_6_2(fn, 32e9, 1024, 3) >= 1e12
    _compare_6_2(fn, 24e9, 1, 0)  # GPT-2's 1.5B parameters need 24 GB: exactly 1.5e9


@public_check("6.2")
def largest_model_at_every_stage_and_convention(ns):
    """All four stages and conventions, 1 to 1000 ranks: the bound inverts model_state_bytes' formula."""
    fn = answer(ns, "largest_model")
    for convention in CONVENTIONS.values():
        for world_size in (1, 3, 8, 1000):
            for stage in range(4):
                _compare_6_2(fn, 80e9, world_size, stage, convention=convention)
                _compare_6_2(fn, 40e9 + 7, world_size, stage, convention=convention)


@public_check("6.2")
def reserved_bytes_are_kept_free(ns):
    """Memory kept for activations and buffers is subtracted first; nothing fits when it takes everything."""
    fn = answer(ns, "largest_model")
    for world_size, stage in ((8, 2), (3, 3), (5, 0)):
        _compare_6_2(fn, 80e9, world_size, stage, reserved_bytes=12.5e9)
    for reserved in (80e9, 100e9):
        got = fn(80e9, 8, 3, reserved_bytes=reserved)
        assert got == 0, (f"largest_model(80e9, 8, 3, reserved_bytes={reserved:g}) = {got!r}; nothing fits when the "
                          "reserved bytes take all the memory: return 0")
