"""Checks of lab 6.1: model_state_bytes, every category of every ZeRO stage equal to helpers.theory.zero_memory."""
import math

from helpers import theory
from helpers.grading.checks.lab06.common import CONVENTIONS, KEYS
from helpers.grading.registry import answer, public_check

SHARDED_FROM = {"optimizer": 1, "grads": 2, "params": 3}  # stage from which a category is sharded


# --- 6.1 model_state_bytes ----------------------------------------------------------------------

def _category_hint(key, stage, got, expected, unsharded, sharded):
    """Why one category is wrong, when the mistake is a common one."""
    if key == "total":
        return "; 'total' must be the sum of 'params', 'grads' and 'optimizer'"
    if got == 0 and expected:
        hint = f"; stage {stage} keeps the {key} (sharded or not), it never drops them"
        return hint + (": a ZeRO-2 total without the gradients is the '210 GB' error of chapter 06"
                       if key == "grads" else "")
    shards = stage >= SHARDED_FROM[key]
    if shards and math.isclose(got, unsharded, rel_tol=1e-9) and unsharded != sharded:
        return f"; stage {stage} shards the {key}: each device holds bytes / world_size of them"
    if not shards and math.isclose(got, sharded, rel_tol=1e-9) and unsharded != sharded:
        return (f"; stage {stage} does not shard the {key} (they are sharded from stage {SHARDED_FROM[key]} on): "
                "every device holds all of them")
    return ""


def _compare_6_1(fn, num_params, world_size, stage, convention=None):
    """Assert fn(...) == helpers.theory.zero_memory(...) in every category, with a hint for common mistakes."""
    if convention is None:
        got = fn(num_params, world_size, stage)
        p, g, k = 2, 2, 12
        call = f"model_state_bytes({num_params:g}, {world_size}, {stage})"
    else:
        p, g, k = convention
        got = fn(num_params, world_size, stage, param_bytes=p, grad_bytes=g, optimizer_bytes=k)
        call = (f"model_state_bytes({num_params:g}, {world_size}, {stage}, param_bytes={p}, grad_bytes={g}, "
                f"optimizer_bytes={k})")
    assert isinstance(got, dict), f"{call} returned {type(got).__name__}; return a dict with keys {list(KEYS)}"
    assert set(got) == set(KEYS), f"{call} returned keys {sorted(got)}; expected exactly {list(KEYS)}"
    expected = theory.zero_memory(num_params, world_size, stage, k, param_bytes=p, grad_bytes=g)
    per_category = {"params": p, "grads": g, "optimizer": k}
    for key in KEYS:
        value = float(got[key])
        if math.isclose(value, expected[key], rel_tol=1e-9, abs_tol=1e-9):
            continue
        hint = ""
        if key != "total":
            unsharded = per_category[key] * num_params
            hint = _category_hint(key, stage, value, expected[key], unsharded, unsharded / world_size)
            if convention is not None and math.isclose(
                    value, theory.zero_memory(num_params, world_size, stage)[key], rel_tol=1e-9):
                hint += "; it is the default 2 + 2 + 12 answer: use param_bytes, grad_bytes and optimizer_bytes"
        else:
            hint = _category_hint(key, stage, value, expected[key], 0, 0)
        raise AssertionError(f"{call}[{key!r}] = {value:.6g} bytes; expected {expected[key]:.6g}{hint}")
    return got


@public_check("6.1")
def figure_1_of_the_zero_paper(ns):
    """psi = 7.5B on 64 GPUs, 2 + 2 + 12 bytes per parameter: 120, 31.4, 16.6 and 1.9 GB per device."""
    fn = answer(ns, "model_state_bytes")
    totals = [_compare_6_1(fn, 7.5e9, 64, stage)["total"] / 1e9 for stage in range(4)]
    assert [round(t, 1) for t in totals] == [120.0, 31.4, 16.6, 1.9], totals


@public_check("6.1")
def every_stage_and_convention(ns):
    """All four stages, every convention of helpers.theory, odd and even world sizes, several model sizes."""
    fn = answer(ns, "model_state_bytes")
    for convention in CONVENTIONS.values():
        for world_size in (1, 3, 8, 1024):
            for stage in range(4):
                for num_params in (12_345, 1.3e9, 70e9):
                    _compare_6_1(fn, num_params, world_size, stage, convention)


@public_check("6.1")
def one_device_shards_nothing(ns):
    fn = answer(ns, "model_state_bytes")
    ddp = fn(1e9, 1, 0)
    for stage in (1, 2, 3):
        got = fn(1e9, 1, stage)
        assert all(math.isclose(float(got[k]), float(ddp[k])) for k in KEYS), (
            f"with world_size=1, stage {stage} should equal stage 0 (nothing to shard over); got {got} vs {ddp}")


@public_check("6.1")
def rejects_bad_stage_and_world_size(ns):
    fn = answer(ns, "model_state_bytes")
    for args, what in (((1e9, 8, 4), "stage=4"), ((1e9, 8, -1), "stage=-1"), ((1e9, 0, 1), "world_size=0")):
        try:
            fn(*args)
        except ValueError:
            continue
        raise AssertionError(f"model_state_bytes{args} ({what}) should raise ValueError: stages are 0, 1, 2, 3 "
                             "and world_size >= 1")
