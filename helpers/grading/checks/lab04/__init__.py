"""Public checks of lab 04: a bucketed, overlapped DDP (assign_buckets, Bucket, Reducer, train_bucketed, BucketedDDP).

Multi-rank checks run the student's code through `helpers.launch` (Gloo, CPU) at world sizes 2 and 3, with different
data on every rank. Rank-side functions (`_on_ranks_*`) return plain data; expected values are computed here, in the
kernel, from the same deterministic data, and the messages name the usual wrong answers: averaging the parameters
instead of the gradients, not waiting for the all-reduce, one all-reduce per parameter, no overlap with backward.
Two checks make the last rank a straggler (it sleeps before its last gradient), so that a missing `wait()` gives
wrong gradients on rank 0 every time, not once in a while.
"""
from helpers.grading.checks.lab04 import (  # noqa: F401 - importing a question's module registers its checks
    q1_assign_buckets,
    q2_bucket,
    q3_reducer,
    q4_train_bucketed,
    q5_bucketed_ddp,
)
