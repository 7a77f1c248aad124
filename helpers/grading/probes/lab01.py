"""Hidden tests of lab 01 (gradient averaging). Public in this repository: see the README.

Every probe runs the public check's own code (1.1 in the kernel, 1.2 and 1.3 on the ranks) with an offset from the
question's secret seed (other weights and data), and the grader judges the results with the check's own assertions,
whose references it computes from the same seed (judges.checked), so the feedback says what the check says.
"""
from helpers.grading.checks.lab01 import common
from helpers.grading.checks.lab01 import q1_weighted_mean_grads as q1
from helpers.grading.checks.lab01 import q2_global_token_mean_loss as q2
from helpers.grading.checks.lab01 import q3_average_gradients as q3
from helpers.grading.probes import Probe
from helpers.grading.probes.judges import checked

OFFSETS = 1000  # the checks' weights and data move by the secret seed modulo this

SETUP = f'''
from helpers.grading.shared_run import launch_gloo as _probe_launch
from helpers.grading.checks.lab01 import (q1_weighted_mean_grads as _probe_q1, q2_global_token_mean_loss as _probe_q2,
                                          q3_average_gradients as _probe_q3)

_probe_offset = _PROBE_SEED % {OFFSETS}
'''

# 1.2's ranks and tokens (as the check's: a rank with no token to predict in the second), 1.3's samples per rank.
TOKENS = ([[9, 4], [2], [6, 6, 3]], [[7, 5], [1, 1], [3, 8]])
SAMPLES = ((5, 7, 2), (6, 0, 3))


def _offset(check):
    return lambda value, seed: check(value, seed % OFFSETS)


PROBES = [
    Probe("1.1", "flat gradients of three unequal shards",
          "_probe_q1.weighted_run(weighted_mean_grads, False, offset=_probe_offset)",
          judge=checked(_offset(q1.check_flat))),
    Probe("1.1", "per-parameter lists", "_probe_q1.weighted_run(weighted_mean_grads, True, offset=_probe_offset)",
          judge=checked(_offset(q1.check_lists))),
    Probe("1.1", "a shard without samples (its gradient NaN)",
          "_probe_q1.weighted_run(weighted_mean_grads, False, (4, 0, 6), True, _probe_offset)",
          judge=checked(_offset(q1.check_empty))),
    Probe("1.2", "3 ranks with unequal numbers of tokens",
          f"_probe_launch(_probe_q2.token_rank, 3, args=(global_token_mean_loss, {TOKENS[0]}, False, _probe_offset), "
          "hang_timeout=10)", judge=checked(lambda r, seed: q2.check_token_results(r, TOKENS[0], seed % OFFSETS)),
          hint=common.HANG_HINT),
    Probe("1.2", "a rank with one token per sequence (none to predict), a bool mask",
          f"_probe_launch(_probe_q2.token_rank, 3, args=(global_token_mean_loss, {TOKENS[1]}, True, _probe_offset), "
          "hang_timeout=10)", judge=checked(lambda r, seed: q2.check_token_results(r, TOKENS[1], seed % OFFSETS)),
          hint=common.HANG_HINT),
    Probe("1.3", "3 ranks with unequal samples: every rank's gradients",
          f"_probe_launch(_probe_q3.gradient_rank, 3, args=(average_gradients, {SAMPLES[0]}, _probe_offset), "
          "hang_timeout=10)", points=2,
          judge=checked(lambda r, seed: q3.check_gradient_results(r, SAMPLES[0], seed % OFFSETS)),
          hint=common.HANG_HINT),
    Probe("1.3", "3 ranks, one of them without samples",
          f"_probe_launch(_probe_q3.gradient_rank, 3, args=(average_gradients, {SAMPLES[1]}, _probe_offset), "
          "hang_timeout=10)", judge=checked(lambda r, seed: q3.check_gradient_results(r, SAMPLES[1], seed % OFFSETS)),
          hint=common.HANG_HINT),
]

# No question's probes call another question's answer (helpers/grading/judge/reference.py).
USES = {}
