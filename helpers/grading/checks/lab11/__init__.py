"""Public checks of lab 11 (operating data parallelism): three planted failures fixed, a resumable loop.

11.1-11.3 run the student's fixed function on 3 ranks (different data on each) through helpers.launch;
11.4 runs chapter 11's crash-and-resume on 2 ranks: an uninterrupted run, a run whose last rank dies at a
step, a relaunch that resumes. One launch (or one trio) serves all the checks of a question.
"""
from helpers.grading.checks.lab11 import (  # noqa: F401 - importing a question's module registers its checks
    q1_class_counts,
    q2_train_until,
    q3_unused_head,
    q4_resume,
)
