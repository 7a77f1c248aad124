"""Public checks of lab 05: accumulation with DDP's no_sync, an alpha-beta step-time simulator, micro-batches.

5.1 runs the student's accumulate_and_step on DDP ranks (Gloo, CPU tensors): the CommLedger counts one bucket set of
all-reduces per optimizer step (read from step 3 on: DDP rebuilds its buckets after the first iteration), and the
parameters equal one process on the whole global batch. 5.2 compares predictions with helpers.theory's ring formula
on instructor inputs. 5.3 checks the sharding, then trains with 5.1 and 5.3 together on ranks with different data.
Wrong answers are recognised where possible (loss divided by the number of micro-batches, backward-only no_sync,
no first bucket, ...) to say what to fix.
"""
from helpers.grading.checks.lab05 import (  # noqa: F401 - importing a question's module registers its checks
    q1_accumulate_and_step,
    q2_step_time_and_scaling,
    q3_micro_batches_of_rank,
)
