"""Public checks of lab 01: gradient averaging with unequal shards and a token-normalised loss.

Every multi-rank check runs the student's function on ranks through helpers.launch (Gloo, CPU tensors) at world
size 3 (and 2), with different and unequal data on every rank, and compares with one process on the whole batch.
Wrong answers are recognised where possible (plain mean, missing world-size factor, ...) to say what to fix.
"""
from helpers.grading.checks.lab01 import (  # noqa: F401 - importing a question's module registers its checks
    q1_weighted_mean_grads,
    q2_global_token_mean_loss,
    q3_average_gradients,
)
