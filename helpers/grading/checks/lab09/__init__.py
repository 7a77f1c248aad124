"""Public checks of lab 09: choose a strategy for a memory budget, apply it with fully_shard or DDP, train inside it.

9.1 is a pure function, compared with the rule of the lab (fewest wire bytes among the strategies whose model states
fit, ties to the simpler one) on cases chosen so that each usual wrong answer gives another strategy. 9.2 and 9.3 run
the student's code through `helpers.launch` (Gloo, CPU) on a small residual MLP whose widths (10, 20) are not
multiples of 3 or 4, so FSDP pads its shards: byte counts are compared with `helpers.theory` evaluated on the
*padded* parameter count (exact), and the messages also give the unpadded formula (the tolerance is the padding).
9.4 is a pure function judged rule by rule (q4_choose_framework.decide): a wrong tool is named by the rule it broke.
"""
from helpers.grading.checks.lab09 import (  # noqa: F401 - importing a question's module registers its checks
    q1_choose_strategy,
    q2_apply_strategy,
    q3_train_within_budget,
    q4_choose_framework,
)
