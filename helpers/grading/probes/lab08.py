"""Hidden tests of lab 08 (ZeRO-3 / FSDP from scratch). Public in this repository: see the README.

Every probe runs a public check's own rank function (on 3 and 4 ranks for 8.1, 3 for 8.2 to 8.4, 2 to 4 for 8.5, as
the checks do) with the checks' OFFSET set from the question's secret seed (other units, data and gradients); a value
is judged by the question's public checks themselves, run in the grader on it (judges.by_public_checks), and must
equal the solution's, so the feedback says what the check says. 8.2 to 8.4 build their units with the checks'
reference layout (_ref_init) on the student's class; 8.5 trains next to torch DDP and FSDP2, as the check does.
"""
import dataclasses

from helpers.grading.checks.lab08 import common
from helpers.grading.checks.lab08 import q1_flat_shard_init as q1
from helpers.grading.checks.lab08 import q2_unshard as q2
from helpers.grading.checks.lab08 import q3_reshard as q3
from helpers.grading.checks.lab08 import q4_reduce_scatter_grads as q4
from helpers.grading.checks.lab08 import q5_train_fsdp as q5
from helpers.grading.probes import Probe
from helpers.grading.probes.judges import by_public_checks
from helpers.grading.probes.offsets import OFFSETS, at_offset_setup

SETUP = '''
from helpers.grading.shared_run import launch_gloo as _probe_launch
from helpers.grading.checks.lab08 import (q1_flat_shard_init as _probe_q1, q2_unshard as _probe_q2,
                                          q3_reshard as _probe_q3, q4_reduce_scatter_grads as _probe_q4,
                                          q5_train_fsdp as _probe_q5)
''' + at_offset_setup("lab08", keep_tuples=True) + '''

def _probe_runs(fn, world_sizes, answer):
    """{world size: every rank's result}, as the checks' _results gives it (the keys as text)."""
    return {str(n): _probe_launch(_probe_at_offset, n, args=(_probe_offset, fn, answer), hang_timeout=30)
            for n in world_sizes}
'''


def _int_keys(value):
    return {int(n): ranks for n, ranks in value.items()}


def _checks(question, module, name, skip=()):
    return by_public_checks(question, (module, name), (common, OFFSETS), names=("FlatShard", "train_fsdp"),
                            skip=skip, convert=_int_keys)


PROBES = [
    Probe("8.1", "a nested unit, a tiny one and the root's after an inner one, in float32 and bfloat16, 3 and 4 ranks",
          "_probe_runs(_probe_q1._init_on_rank, (3, 4), FlatShard)", points=4, judge=_checks("8.1", q1, "_r81"),
          hint=common.HINT),
    Probe("8.2", "the same units, gathered in float32 and bfloat16, then a forward and a backward, 3 ranks",
          "_probe_runs(_probe_q2._unshard_on_rank, (3,), FlatShard)", points=4, judge=_checks("8.2", q2, "_r82"),
          hint=common.HINT),
    Probe("8.3", "free after a forward, twice, then gather again, 3 ranks",
          "_probe_runs(_probe_q3._reshard_on_rank, (3,), FlatShard)", points=2, judge=_checks("8.3", q3, "_r83"),
          hint=common.HINT),
    Probe("8.4", "two backward passes, and bfloat16 gradients reduced in bfloat16 and float32, 3 ranks",
          "_probe_runs(_probe_q4._reduce_on_rank, (3,), FlatShard)", points=4, judge=_checks("8.4", q4, "_r84"),
          hint=common.HINT),
    Probe("8.5", "two blocks and a root, 3 steps on 2, 3 and 4 ranks next to torch DDP, then by type in bfloat16",
          "_probe_runs(_probe_q5._train_on_rank, (2, 3, 4), train_fsdp)", points=6, judge=_checks("8.5", q5, "_r85"),
          hint=common.HINT, errors=((q5.NO_PARAMETER, q5.NO_HOOKS),)),
]

# Using PyTorch's FSDP scores 0 on the questions that rebuild it.
_FORBIDDEN = ("fully_shard", "FullyShardedDataParallel")
PROBES = [dataclasses.replace(p, forbidden=_FORBIDDEN) for p in PROBES]

# The earlier answers each question's probes call, directly or through other answers, graded with the
# solution's versions bound in their place (helpers/grading/judge/reference.py): 8.2-8.4 are methods of 8.1's FlatShard;
# train_fsdp builds FlatShards, whose hooks call 8.2-8.4.
USES = {'8.2': ('8.1',), '8.3': ('8.1',), '8.4': ('8.1',), '8.5': ('8.1', '8.2', '8.3', '8.4')}
