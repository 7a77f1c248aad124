"""Public checks of lab 08 (ZeRO-3 / FSDP from scratch): the sharded unit (FlatShard's __init__, unshard, reshard,
reduce_scatter_grads) and the training loop around it, proved against torch DDP + SGD at world sizes 2, 3 and 4.

8.2 to 8.4 build their unit with the reference layout `_ref_init`, not the student's __init__, so that each method is
checked on its own. No unit divides evenly: the nested block has 47 parameters (one padding zero on 3 and 4 ranks),
Linear(1, 1) has 2 (on 3 ranks the last shard is padding only). One launch per world size serves all the checks of a
question; its result is kept, keyed by the student's functions, until they are redefined.
"""
from helpers.grading.checks.lab08 import (  # noqa: F401 - importing a question's module registers its checks
    q1_flat_shard_init,
    q2_unshard,
    q3_reshard,
    q4_reduce_scatter_grads,
    q5_train_fsdp,
)
