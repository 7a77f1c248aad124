"""Public checks of lab 10 (capstone): each rank's batch, the data-parallel GPT step, the whole training run.

10.1 runs in the kernel (get_batch needs no process group). 10.2 and 10.3 run the student's functions on 3
ranks (odd on purpose) through helpers.launch; each question launches once and its result is kept, keyed by
the student's function objects, until they are redefined. The GPT is chapters/capstone/model.py, imported
from the repository (the lab imports it the same way); the references are one process on the global batch
(10.2) and torch DistributedDataParallel on the same batches (10.3).
"""
from helpers.grading.checks.lab10 import (  # noqa: F401 - importing a question's module registers its checks
    q1_get_batch,
    q2_train_step,
    q3_train_gpt,
)
