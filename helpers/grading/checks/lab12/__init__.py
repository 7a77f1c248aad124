"""Public checks of lab 12 (mixed precision): a dynamic loss scaler proved against torch.amp.GradScaler, its skips
kept together across ZeRO-2 shards (as ShardedGradScaler does), what bf16 autocast keeps in memory against the
formulas, and a mixed-precision DDP loop proved against GradScaler's.

12.2 and 12.4 run the student's functions on 3 ranks (odd: the flat parameter of 12.2 needs padding) through
helpers.launch; the functions travel by value. One launch serves all the checks of a question: its result is kept,
keyed by the student's functions and classes, until any is redefined. 12.1 and 12.3 run in the notebook's process.
"""
from helpers.grading.checks.lab12 import (  # noqa: F401 - importing a question's module registers its checks
    q1_loss_scaler,
    q2_zero2_scaled_step,
    q3_autocast_bytes,
    q4_train_mixed,
)
