"""Public checks of lab 07 (ZeRO-1 and ZeRO-2): shard arithmetic, the sharded AdamW step, the gradient
reduce-scatter, the training loop proved against torch DDP + AdamW, and the same pieces as a torch.optim.Optimizer
proved against torch.optim.AdamW.

Multi-rank checks run the student's functions on 3 ranks (an odd world size: every flat parameter here needs
padding) through helpers.launch; the functions travel by value. One launch serves all the checks of a question:
its result is kept, keyed by the student's functions and classes, until any is redefined.
"""
from helpers.grading.checks.lab07 import (  # noqa: F401 - importing a question's module registers its checks
    q1_shard_range,
    q2_zero_adamw_step,
    q3_reduce_scatter_gradients,
    q4_train_zero2,
    q5_zero_adamw,
)
