"""Checks of lab 9.1: choose_strategy, the fewest wire bytes among the strategies that fit; usual mistakes named."""
from helpers.grading.checks.lab09.common import FP32_ADAM
from helpers.grading.registry import answer, public_check

# ------------------------------------------------------------------------------------------------ question 9.1
_GB = 1e9
# The usual wrong rules, named as the hint names them.
MISTAKES = (
    "the strategy with the least memory: the rule is the least COMMUNICATION among those that fit",
    "the fewest LOGICAL bytes (an all-gather over a group of 8 counts like one over 32): compare "
    "comm_volume(..., kind='wire'), the bytes each rank sends",
    "hybrid_shard's memory over all ranks: it shards over group_size ranks only "
    "(strategy_memory(..., group_size=group_size))",
    "a budget that must be strictly larger: a strategy that needs exactly the budget fits (<=)",
    "the default 2 + 2 + 12 convention: pass k, param_bytes and grad_bytes on to theory.strategy_memory",
    "ZeRO-2 on a tie with DDP: equal bytes go to the EARLIER strategy in STRATEGY_ORDER (DDP)",
)
NO, SGO, HYB, FULL = "no_shard", "shard_grad_op", "hybrid_shard", "full_shard"
# (label, args, kwargs, the right choice, what each of MISTAKES chooses): the choices recorded, worked out once
# with helpers.theory. Each case separates the right rule from at least one mistake.
CHOOSE_CASES = [
    ("1.5B on 32 ranks, 60 GB (DDP fits; ZeRO-2 sends the same bytes: the tie goes to DDP)",
     (1.5e9, 32, 60 * _GB), {"group_size": 8},
     NO, (FULL, NO, NO, NO, NO, SGO)),
    ("7B on 32 ranks, 60 GB", (7e9, 32, 60 * _GB), {"group_size": 8},
     SGO, (FULL, SGO, SGO, SGO, SGO, SGO)),
    ("28B on 32 ranks, 60 GB, groups of 8", (28e9, 32, 60 * _GB), {"group_size": 8},
     HYB, (FULL, FULL, HYB, HYB, HYB, HYB)),
    ("28B on 32 ranks, 60 GB, no group_size (hybrid_shard is not a candidate)", (28e9, 32, 60 * _GB), {},
     FULL, (FULL, FULL, FULL, FULL, FULL, FULL)),
    ("40B on 32 ranks, 60 GB, groups of 8 (one copy per group of 8 needs 80 GB)", (40e9, 32, 60 * _GB),
     {"group_size": 8},
     FULL, (FULL, FULL, HYB, FULL, FULL, FULL)),
    ("70B on 32 ranks, 60 GB, groups of 8", (70e9, 32, 60 * _GB), {"group_size": 8},
     FULL, (FULL, FULL, HYB, FULL, FULL, FULL)),
    ("1B on 8 ranks, a budget of exactly 16 GB (<= fits)", (1e9, 8, 16 * _GB), {},
     NO, (FULL, NO, NO, SGO, NO, SGO)),
    ("1B on 4 ranks, 8 GB, fp32 Adam (k=8, 4-byte parameters and gradients)", (1e9, 4, 8 * _GB), FP32_ADAM,
     SGO, (FULL, SGO, SGO, SGO, SGO, SGO)),
    ("200B on 32 ranks, 60 GB: nothing fits", (200e9, 32, 60 * _GB), {"group_size": 8},
     None, (None, None, None, None, None, None)),
    ("1B on 4 ranks, 6 GB, fp32 Adam (ZeRO-2 needs 4 + 12 / 4 = 7 GB; with 2 + 2 + 12 bytes it would fit)",
     (1e9, 4, 6 * _GB), FP32_ADAM,
     FULL, (FULL, FULL, FULL, FULL, SGO, FULL)),
]


@public_check("9.1")
def cheapest_strategy_that_fits(ns):
    choose = answer(ns, "choose_strategy")
    seen = []  # (wrong choices, got) of the cases so far: a hint must explain all of them, not only the failing one
    for label, args, kwargs, expected, wrong in CHOOSE_CASES:
        got = choose(*args, **kwargs)
        seen.append((wrong, got))
        if got == expected:
            continue
        consistent = [why for i, why in enumerate(MISTAKES) if all(choices[i] == g for choices, g in seen)]
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
