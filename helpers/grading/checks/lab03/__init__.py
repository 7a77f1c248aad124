"""Public checks of lab 03 (manual DDP): sharding, broadcast, gradient averaging, the training loop.

Multi-rank checks run the student's functions on 3 ranks (an odd world size: uneven shards) through
helpers.launch; the functions travel by value. One launch serves all the checks of a question: its
result is kept, keyed by the student's functions and classes, until any is redefined.
"""
from helpers.grading.checks.lab03 import (  # noqa: F401 - importing a question's module registers its checks
    q1_shard_indices,
    q2_broadcast_parameters,
    q3_average_gradients,
    q4_train_manual_ddp,
)
