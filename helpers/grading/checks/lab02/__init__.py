"""Public checks of lab 02: ring all-reduce built from point-to-point messages.

Every multi-rank check runs the student's functions through `helpers.launch` with a short
hang_timeout, so a deadlock becomes a failure with the launcher's report instead of a stuck notebook.
Rank-side helpers (names starting with `_on_ranks`) return plain data; the comparisons and the
messages are made here, in the kernel.
"""
from helpers.grading.checks.lab02 import (  # noqa: F401 - importing a question's module registers its checks
    q1_exchange_with_neighbours,
    q2_ring_reduce_scatter,
    q3_ring_all_gather,
    q4_ring_all_reduce,
    q5_average_gradients,
)
