"""Hidden tests of lab 12 (mixed precision). Public in this repository: see the README.

Every probe runs the function its question's public checks read their results from, with the checks' OFFSET set
from the question's secret seed: 12.1 another stream (first scale, growth interval, where the inf, the NaN and the
overflow fall, the gradients), 12.2 other weights, data and injected infs on 3 ranks, 12.3 other sizes of the MLP, 12.4
other weights and data on 3 ranks. A value that is not the solution's is diagnosed by the question's public checks
themselves, run in the grader on that value (judges.by_public_checks), so the feedback says what the check says.
"""
from helpers.grading.checks.lab12 import common
from helpers.grading.checks.lab12 import q1_loss_scaler as q1
from helpers.grading.checks.lab12 import q2_zero2_scaled_step as q2
from helpers.grading.checks.lab12 import q3_autocast_bytes as q3
from helpers.grading.checks.lab12 import q4_train_mixed as q4
from helpers.grading.probes import Probe
from helpers.grading.probes.judges import by_public_checks
from helpers.grading.probes.offsets import OFFSETS, at_offset_setup

SETUP = '''
from helpers.grading.shared_run import launch_gloo as _probe_launch
from helpers.grading.checks.lab12 import (q1_loss_scaler as _probe_q1, q2_zero2_scaled_step as _probe_q2,
                                          q3_autocast_bytes as _probe_q3, q4_train_mixed as _probe_q4)
''' + at_offset_setup("lab12") + '''

def _probe_here(fn, *answers):
    return _probe_at_offset(_probe_offset, fn, *answers)


def _probe_run(fn, *answers):
    return _probe_launch(_probe_at_offset, 3, args=(_probe_offset, fn, *answers), hang_timeout=20)
'''


def _checks(question, module, names, skip=()):
    return by_public_checks(question, (module, "_results"), (common, OFFSETS), names=names, skip=skip)


PROBES = [
    Probe("12.1", "16 steps beside GradScaler: first scale 2^8-2^12, growth interval 2-3, an inf, a NaN and an "
          "overflow at steps from the seed", "_probe_here(_probe_q1.runs, LossScaler)", points=4,
          judge=_checks("12.1", q1, ("LossScaler",)),
          forbidden=("GradScaler", "_amp_update_scale_", "_amp_foreach_non_finite_check_and_unscale_")),
    Probe("12.2", "3 ranks, ZeRO-2, infs in another rank's shard at steps from the seed, beside ShardedGradScaler",
          "_probe_run(_probe_q2._on_rank, zero2_scaled_step, LossScaler)", points=4,
          judge=_checks("12.2", q2, ("zero2_scaled_step", "LossScaler")), hint=q2.HINT,
          forbidden=("ShardedGradScaler", "GradScaler")),
    Probe("12.3", "an MLP of sizes from the seed, fp32 and bf16 autocast, against the formulas",
          "_probe_here(_probe_q3.runs, autocast_bytes)", points=3,
          judge=_checks("12.3", q3, ("autocast_bytes",))),
    Probe("12.4", "3 ranks, DDP, fp16 autocast, weights and data from the seed, beside GradScaler's documented loop",
          "_probe_run(_probe_q4._on_rank, train_mixed, LossScaler)", points=4,
          judge=_checks("12.4", q4, ("train_mixed", "LossScaler")), hint=q4.HINT),
]

# The earlier answers each question's probes call, graded with the solution's versions bound in their place
# (helpers/grading/judge/reference.py): 12.2's step and 12.4's run with the LossScaler of 12.1.
USES = {"12.2": ("12.1",), "12.4": ("12.1",)}
