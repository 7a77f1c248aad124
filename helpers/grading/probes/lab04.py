"""Hidden tests of lab 04 (bucketing and overlap). Public in this repository: see the README.

4.2 to 4.5 run the public checks' own rank functions with an offset from the question's secret seed (other initial
weights, data and gradients), and the grader judges their reports with the checks' own assertions
(judges.checked; 4.4 and 4.5, whose runs train torch DDP on the student's ranks, must also equal the solution's
values), so the feedback says what the check says; 4.1 calls assign_buckets on secret sizes and names the
usual mistake as the check does (q1.diagnose), without the right buckets.
"""
import dataclasses

import torch

from helpers.grading.checks.lab04 import common
from helpers.grading.checks.lab04 import q1_assign_buckets as q1
from helpers.grading.checks.lab04 import q2_bucket as q2
from helpers.grading.checks.lab04 import q3_reducer as q3
from helpers.grading.checks.lab04 import q4_train_bucketed as q4
from helpers.grading.checks.lab04 import q5_bucketed_ddp as q5
from helpers.grading.probes import Probe
from helpers.grading.probes.judges import checked, diagnosed, equal_and_checked

OFFSETS = 1000  # the checks' initial weights, data and gradients move by the secret seed modulo this

SETUP = f'''
import torch as _probe_torch
from helpers.grading.shared_run import launch_gloo as _probe_launch
from helpers.grading.checks.lab04 import (common as _probe_common, q2_bucket as _probe_q2, q3_reducer as _probe_q3,
                                          q4_train_bucketed as _probe_q4, q5_bucketed_ddp as _probe_q5)

_probe_offset = _PROBE_SEED % {OFFSETS}


def _probe_sizes(count, largest):
    """Parameter sizes drawn from the question's secret seed."""
    g = _probe_torch.Generator().manual_seed(_PROBE_SEED)
    return _probe_torch.randint(1, largest + 1, (count,), generator=g).tolist()


def _probe_assign(sizes, cap):
    return {{"sizes": sizes, "cap": cap, "got": assign_buckets([_probe_torch.empty(n) for n in sizes], cap)}}


def _probe_straggler(fn, component):
    """The check's run with a slow rank 1, again (at most 3 runs) until rank 0 was seen to come first."""
    for _ in range(3):
        report = _probe_launch(fn, 2, args=(component, 1, _probe_common.SLOW_RANK_S, _probe_offset), hang_timeout=10)
        if report[0][0]["launch_start"] < report[1][0]["launch_start"]:
            break
    return report
'''


def _assignment(expected, actual, seed):
    got = [[int(i) for i in bucket] for bucket in actual["got"]]
    return q1.diagnose(got, [torch.empty(n) for n in expected["sizes"]], expected["cap"])


def _bucket_straggler(report, seed):
    if q2.seen_in_order(report):  # else the grading machine was too busy to tell: the values only
        q2.check_no_wait(report, seed % OFFSETS)
    else:
        q2._check_bucket_report(report, 2, [0], seed % OFFSETS)


def _training(results, seed):
    q4.check_training(results, 3, common.STEPS, common.LR, common.TOL, seed % OFFSETS)


def _wrapper(reports, seed):
    q5.check_wraps(reports, seed % OFFSETS)
    q5.check_refuses(reports)
    q5.check_trains(reports, common.STEPS, common.LR, common.TOL)


PROBES = [
    Probe("4.1", "ten parameters of secret sizes, 100-byte cap", "_probe_assign(_probe_sizes(10, 30), 100)",
          judge=diagnosed(_assignment)),
    Probe("4.1", "a cap larger than the model", "_probe_assign(_probe_sizes(2 + _PROBE_SEED % 5, 9), 10**6)",
          judge=diagnosed(_assignment)),
    Probe("4.2", "3 ranks, one bucket of four tensors, 2 steps",
          "_probe_launch(_probe_q2._on_ranks_bucket, 3, args=(Bucket, 2, 0.0, _probe_offset), hang_timeout=10)",
          judge=checked(lambda report, seed: q2._check_bucket_report(report, 3, range(3), seed % OFFSETS))),
    Probe("4.2", "2 ranks, rank 1 late: add_grad does not wait, finish() does",
          "_probe_straggler(_probe_q2._on_ranks_bucket, Bucket)", judge=checked(_bucket_straggler)),
    Probe("4.3", "3 ranks, the lab's MLP, 2 steps: one all-reduce per bucket during backward, the mean",
          "_probe_launch(_probe_q3._on_ranks_reducer, 3, args=(Reducer, 2, 0.0, _probe_offset), hang_timeout=10)",
          points=2, judge=checked(lambda report, seed: q3._check_reducer_report(report, 3, range(3), seed % OFFSETS))),
    Probe("4.3", "2 ranks, rank 1 late: finalize() waits for it",
          "_probe_launch(_probe_q3._on_ranks_reducer, 2, args=(Reducer, 1, _probe_common.SLOW_RANK_S, _probe_offset), "
          "hang_timeout=10)",
          judge=checked(lambda report, seed: q3._check_reducer_report(report, 2, [0], seed % OFFSETS))),
    Probe("4.4", "3 ranks, 3 steps, next to torch DDP",
          "_probe_launch(_probe_q4._on_ranks_train, 3, args=(train_bucketed, _probe_common.STEPS, _probe_common.LR, "
          "_probe_offset), hang_timeout=20)", points=2, judge=equal_and_checked(_training)),
    Probe("4.5", "3 ranks: the wrapper's shape, its refusal of an unsynchronized step, 3 steps next to torch DDP",
          "_probe_launch(_probe_q5._on_ranks, 3, args=(BucketedDDP, _probe_common.STEPS, _probe_common.LR, "
          "_probe_offset), hang_timeout=20)", points=2,
          judge=equal_and_checked(_wrapper, skip=("message",))),  # the refusal's words are the student's
]

# Using DDP's own bucketing (or DDP itself) scores 0 on the questions that rebuild it.
_FORBIDDEN = ("_compute_bucket_assignment_by_size", "DistributedDataParallel")
PROBES = [dataclasses.replace(p, forbidden=_FORBIDDEN) for p in PROBES]

# The earlier answers each question's probes call, directly or through other answers, graded with the
# solution's versions bound in their place (helpers/grading/judge/reference.py): Reducer fills Buckets from
# assign_buckets;
# train_bucketed and BucketedDDP build a Reducer.
USES = {'4.3': ('4.1', '4.2'), '4.4': ('4.1', '4.2', '4.3'), '4.5': ('4.1', '4.2', '4.3')}
