"""Public checks of lab 10 (capstone): the GPT trained with the student's own Reducer, ZeRO-2 and FlatShard.

Each question calls the student's bring function in the kernel, then trains chapter 10's GPT on 3 Gloo ranks
(odd on purpose: every flat buffer pads) with `capstone.yours.train`, once with the component and once with
PyTorch's counterpart (DDP, ZeroRedundancyOptimizer, fully_shard), and reads both runs: the invariant (different
data, identical parameters), equality with PyTorch, the collectives the student's code issued in every step (a
CommLedger per step) and the bytes each rank holds between steps. 10.5 runs 10.3's FlatShard with the student's own
hooks, which prefetch in backward, and reads the order in which every rank issued its collectives, unit by unit.
"""
from helpers.grading.checks.lab10 import (  # noqa: F401 - importing a question's module registers its checks
    q1_reducer,
    q2_zero2,
    q3_flat_shard,
    q5_prefetch,
)
