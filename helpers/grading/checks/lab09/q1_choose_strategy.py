"""Checks of lab 9.1: choose_strategy, the fewest wire bytes among the strategies that fit; usual mistakes named."""
from helpers import theory
from helpers.grading.checks.lab09.common import FP32_ADAM, STRATEGY_ORDER, reference_choose
from helpers.grading.registry import answer, public_check

# ------------------------------------------------------------------------------------------------ question 9.1
_GB = 1e9
# (label, args, kwargs): each case separates the right rule from at least one usual wrong answer.
CHOOSE_CASES = [
    ("1.5B on 32 ranks, 60 GB (DDP fits; ZeRO-2 sends the same bytes: the tie goes to DDP)",
     (1.5e9, 32, 60 * _GB), {"group_size": 8}),
    ("7B on 32 ranks, 60 GB", (7e9, 32, 60 * _GB), {"group_size": 8}),
    ("28B on 32 ranks, 60 GB, groups of 8", (28e9, 32, 60 * _GB), {"group_size": 8}),
    ("28B on 32 ranks, 60 GB, no group_size (hybrid_shard is not a candidate)", (28e9, 32, 60 * _GB), {}),
    ("40B on 32 ranks, 60 GB, groups of 8 (one copy per group of 8 needs 80 GB)", (40e9, 32, 60 * _GB),
     {"group_size": 8}),
    ("70B on 32 ranks, 60 GB, groups of 8", (70e9, 32, 60 * _GB), {"group_size": 8}),
    ("1B on 8 ranks, a budget of exactly 16 GB (<= fits)", (1e9, 8, 16 * _GB), {}),
    ("1B on 4 ranks, 8 GB, fp32 Adam (k=8, 4-byte parameters and gradients)", (1e9, 4, 8 * _GB), FP32_ADAM),
    ("200B on 32 ranks, 60 GB: nothing fits", (200e9, 32, 60 * _GB), {"group_size": 8}),
    ("1B on 4 ranks, 6 GB, fp32 Adam (ZeRO-2 needs 4 + 12 / 4 = 7 GB; with 2 + 2 + 12 bytes it would fit)",
     (1e9, 4, 6 * _GB), FP32_ADAM),
]


def _wrong_choices(args, kwargs):
    """{explanation: what that wrong rule returns} for one case."""
    psi, n, budget = args
    g = kwargs.get("group_size")
    convention = {k: v for k, v in kwargs.items() if k != "group_size"}
    candidates = [s for s in STRATEGY_ORDER if s != "hybrid_shard" or g is not None]

    def memory(s, group=None):
        group = group if s == "hybrid_shard" else None
        return theory.strategy_memory(psi, n, s, group_size=group, **convention)["total"]

    def pick(fits, cost, order=candidates):
        fitting = [s for s in order if fits(s)]
        return min(fitting, key=cost) if fitting else None

    wire = {s: theory.comm_volume(s, psi, n, group_size=g if s == "hybrid_shard" else None, kind="wire")
            for s in candidates}
    logical = {s: theory.comm_volume(s, psi, n, group_size=g if s == "hybrid_shard" else None)
               for s in candidates}
    return {
        "the strategy with the least memory: the rule is the least COMMUNICATION among those that fit":
            pick(lambda s: memory(s, g) <= budget, lambda s: memory(s, g)),
        "the fewest LOGICAL bytes (an all-gather over a group of 8 counts like one over 32): compare "
        "comm_volume(..., kind='wire'), the bytes each rank sends":
            pick(lambda s: memory(s, g) <= budget, logical.get),
        "hybrid_shard's memory over all ranks: it shards over group_size ranks only "
        "(strategy_memory(..., group_size=group_size))":
            pick(lambda s: memory(s, n if s == "hybrid_shard" else g) <= budget, wire.get),
        "a budget that must be strictly larger: a strategy that needs exactly the budget fits (<=)":
            pick(lambda s: memory(s, g) < budget, wire.get),
        "the default 2 + 2 + 12 convention: pass k, param_bytes and grad_bytes on to theory.strategy_memory":
            pick(lambda s: theory.strategy_memory(psi, n, s, group_size=g if s == "hybrid_shard" else None)["total"]
                 <= budget, wire.get),
        "ZeRO-2 on a tie with DDP: equal bytes go to the EARLIER strategy in STRATEGY_ORDER (DDP)":
            pick(lambda s: memory(s, g) <= budget, wire.get, order=sorted(candidates, key=lambda s: s != "shard_grad_op")),
    }


@public_check("9.1")
def cheapest_strategy_that_fits(ns):
    choose = answer(ns, "choose_strategy")
    seen = []  # (args, kwargs, got) of the cases so far: a hint must explain all of them, not only the failing one
    for label, args, kwargs in CHOOSE_CASES:
        expected = reference_choose(*args, **kwargs)
        got = choose(*args, **kwargs)
        seen.append((args, kwargs, got))
        if got == expected:
            continue
        consistent = [why for why in _wrong_choices(args, kwargs)
                      if all(_wrong_choices(a, k)[why] == g for a, k, g in seen)]
        hint = f" That is what you get from {consistent[0]}." if consistent else ""
        if expected is None and got is not None:
            hint = " When no strategy fits, return None."
        raise AssertionError(f"{label}: expected {expected!r}, got {got!r}.{hint}")


@public_check("9.1")
def hybrid_needs_a_group_size(ns):
    choose = answer(ns, "choose_strategy")
    try:
        got = choose(28e9, 32, 60 * _GB)
    except ValueError as exc:
        raise AssertionError("without group_size, skip 'hybrid_shard' (theory raises for it without a group size): "
                             f"{exc}") from None
    assert got == "full_shard", f"28B on 32 ranks, 60 GB, no group_size: expected 'full_shard', got {got!r}"
