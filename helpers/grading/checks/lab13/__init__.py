"""Public checks of lab 13 (compression and local steps): a DDP communication hook that sends fp16 or bf16 with error
feedback, proved against PyTorch's default hooks; PowerSGD, its bytes against the ledger and its parameters against
powerSGD_hook; local SGD, its averages against PeriodicModelAverager and its bytes against DDP's.

Every question runs the student's function on 3 ranks (different data on each) through helpers.launch, next to
PyTorch's version on the same batches; PyTorch's with a switch turned off, or a rule on what the student's hook
received and returned, names a wrong answer. No check holds an answer (release.py). One launch serves all the checks
of a question.
"""
from helpers.grading.checks.lab13 import (  # noqa: F401 - importing a question's module registers its checks
    q1_compress_hook,
    q2_powersgd_hook,
    q3_local_sgd,
)
