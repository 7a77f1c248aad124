"""Hidden tests of lab 07 (ZeRO-1 and ZeRO-2). Public in this repository: see the README.

7.2 to 7.5 run the public checks' own rank functions with the checks' OFFSET set from the question's secret seed
(other parameters, data and gradients), and 7.1 calls shard_range on secret sizes. A value that is not the solution's
is diagnosed by the question's public checks themselves, run in the grader on that value (judges.by_public_checks; 7.1
by the check's rule, q1._diagnose), so the feedback says what the check says.
"""
import dataclasses

from helpers.grading.checks.lab07 import common
from helpers.grading.checks.lab07 import q1_shard_range as q1
from helpers.grading.checks.lab07 import q2_zero_adamw_step as q2
from helpers.grading.checks.lab07 import q3_reduce_scatter_gradients as q3
from helpers.grading.checks.lab07 import q4_train_zero2 as q4
from helpers.grading.checks.lab07 import q5_zero_adamw as q5
from helpers.grading.probes import Probe
from helpers.grading.probes.judges import by_public_checks, diagnosed
from helpers.grading.probes.offsets import OFFSETS, at_offset_setup

SETUP = '''
from helpers.grading.shared_run import launch_gloo as _probe_launch
from helpers.grading.checks.lab07 import (q2_zero_adamw_step as _probe_q2, q3_reduce_scatter_gradients as _probe_q3,
                                          q4_train_zero2 as _probe_q4, q5_zero_adamw as _probe_q5)
''' + at_offset_setup("lab07") + '''

def _probe_run(fn, answer):
    return _probe_launch(_probe_at_offset, 3, args=(_probe_offset, fn, answer), hang_timeout=20)


def _probe_ranges(cases):
    """Each call's (numel, rank, world_size) and the (start, stop, pad) it returned."""
    return [{"args": [n, r, w], "got": list(shard_range(n, r, w))} for n, w in cases for r in range(w)]


def _probe_ranks(numel, world_size):
    refused = []
    for rank in (world_size, -1):
        try:
            shard_range(numel, rank, world_size)
            refused.append("returned")
        except NotImplementedError:
            raise
        except Exception as exc:
            refused.append(type(exc).__name__)
    return {"refused": refused, "last rank": list(shard_range(numel, world_size - 1, world_size))}
'''


def _ranges(expected, actual, seed):
    for want, mine in zip(expected, actual):
        if mine["got"] != want["got"]:
            why = q1._diagnose(*want["args"], tuple(int(v) for v in mine["got"]))
            if why:
                return why
    return None


def _ranks(expected, actual, seed):
    return f"shard_range with a rank outside 0 .. world_size - 1 {q1.RANK_REFUSED}" \
        if actual["refused"] != expected["refused"] else None


def _checks(question, module, name, answer, skip=()):
    return by_public_checks(question, (module, name), (common, OFFSETS), names=(answer,), skip=skip)


PROBES = [
    Probe("7.1", "17-23 elements on 5 ranks", "_probe_ranges([(17 + _PROBE_SEED % 7, 5)])",
          judge=diagnosed(_ranges)),
    Probe("7.1", "fewer elements than ranks, 4 to 8 ranks (ranks with only padding)",
          "_probe_ranges([(1 + _PROBE_SEED % 3, 5 + _PROBE_SEED // 3 % 4)])",
          judge=diagnosed(_ranges)),
    Probe("7.1", "100-149 elements on 7 ranks, and 1 element on 1 rank",
          "_probe_ranges([(100 + _PROBE_SEED % 50, 7), (1, 1)])", judge=diagnosed(_ranges)),
    Probe("7.1", "ranks world_size and -1 refused, 3-5 ranks",
          "_probe_ranks(10 + _PROBE_SEED % 11, 3 + _PROBE_SEED % 3)", judge=diagnosed(_ranks)),
    Probe("7.2", "3 ranks: 34 and 4 parameters (a rank with only padding), 3 steps each",
          "_probe_run(_probe_q2._step_on_rank, zero_adamw_step)", points=6,
          judge=_checks("7.2", q2, "_step_results", "zero_adamw_step"), hint=q2.HINT,
          errors=((q2.SIZE_ERROR, q2.UNPADDED),)),
    Probe("7.3", "3 ranks, a gradient missing on rank 1", "_probe_run(_probe_q3._reduce_on_rank, "
          "reduce_scatter_gradients)", points=4,
          judge=_checks("7.3", q3, "_reduce_results", "reduce_scatter_gradients"), hint=q3.HINT,
          errors=((q3.SIZE_ERROR, q3.UNPADDED),)),
    Probe("7.4", "3 ranks, a frozen first layer, 4 steps, next to torch DDP + AdamW",
          "_probe_run(_probe_q4._train_on_rank, train_zero2)", points=5,
          judge=_checks("7.4", q4, "_training_results", "train_zero2"), hint=q4.HINT),
    Probe("7.5", "3 ranks, two groups and a frozen layer, the lr changed after 2 steps, next to torch AdamW",
          "_probe_run(_probe_q5._train_on_rank, ZeroAdamW)", points=3,
          judge=_checks("7.5", q5, "_results", "ZeroAdamW", skip=("shape",)),  # its ids differ from run to run
          hint=q5.HINT),
]

_FORBIDDEN = ("ZeroRedundancyOptimizer",)
_FORBIDDEN_7_5 = _FORBIDDEN + ("Adam", "AdamW", "adam", "adamw")
PROBES = [dataclasses.replace(p, forbidden=_FORBIDDEN_7_5 if p.question == "7.5" else _FORBIDDEN) for p in PROBES]

# The earlier answers each question's probes call, directly or through other answers, graded with the
# solution's versions bound in their place (helpers/grading/judge/reference.py): zero_adamw_step cuts its shard with
# shard_range; train_zero2 and ZeroAdamW call 7.2 and 7.3.
USES = {'7.2': ('7.1',), '7.4': ('7.1', '7.2', '7.3'), '7.5': ('7.1', '7.2', '7.3')}
