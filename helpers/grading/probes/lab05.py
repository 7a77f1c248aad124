"""Hidden tests of lab 05 (accumulation with no_sync, a step-time simulator). Public in this repository: see the
README.

5.1 and 5.3 run their public checks in the graded kernel, every launch with the checks' OFFSET from the question's
secret seed (other weights and data), and the grader replays the checks on that record
(helpers/grading/judge/replay.py),
so the feedback says what the check says; 5.3's last check trains with the student's accumulate_and_step (5.1),
graded with the solution's (USES). 5.2's formulas are scored on secret inputs, and a wrong value is named by the
public checks replayed on the student's answers to their own (public) inputs.
"""
from helpers.grading.judge.replay import record_setup
from helpers.grading.probes import Probe
from helpers.grading.probes.judges import replayed, tensors_only

COMMON = "helpers.grading.checks.lab05.common"
OFFSETS = 1000  # the checks' OFFSET: the question's secret seed modulo this

SETUP = record_setup(COMMON, f"_PROBE_SEED % {OFFSETS}") + '''

import torch as _probe_torch
import torch.distributed as _probe_dist
import torch.nn.functional as _probe_F
from torch.nn.parallel import DistributedDataParallel as _probe_DDP
from helpers.grading.shared_run import launch_gloo as _probe_launch
from helpers.comm import CommLedger as _probe_Ledger
from helpers.simulate import Link as _probe_Link

# Inputs scale with the question's secret seed: an output memorised for one call is worth nothing.
_probe_s = 1 + (_PROBE_SEED % 997) / 997
_probe_links = {"fast": _probe_Link("probe fast", 2e-6, 200e9), "slow": _probe_Link("probe slow", 50e-6, 1e9)}

'''


def _judge_5_2(record_key="record"):
    """Scored on the secret inputs' values; named by the public checks replayed on the record of their own calls."""
    return replayed("5.2", COMMON, OFFSETS, ("predict_step_time", "scaling_efficiency"), record=record_key,
                    project=lambda value: value["value"])


def _with_record(expr):
    return (f'{{"value": {expr}, "record": _probe_record("5.2", (predict_step_time, scaling_efficiency), '
            '("predict_step_time", "scaling_efficiency"))}')


PROBES = [
    Probe("5.1", "3 and 2 ranks: one bucket set per step, the same steps as one process, DDP's losses",
          '_probe_record("5.1", (accumulate_and_step,), ())', points=3,
          judge=replayed("5.1", COMMON, OFFSETS, ("accumulate_and_step",), project=tensors_only)),
    Probe("5.2", "7e8 parameters, 24 GPUs, slow link, no overlap",
          _with_record("predict_step_time(7e8 * _probe_s, 24, 0.4, _probe_links['slow'])"), judge=_judge_5_2()),
    Probe("5.2", "3e8 fp16 parameters, 16 GPUs, fast link, 12 MiB buckets, overlap 0.6",
          _with_record("predict_step_time(3e8 * _probe_s, 16, 0.25 * _probe_s, _probe_links['fast'], "
                       "bytes_per_param=2, bucket_cap_bytes=12 * 2**20, overlap=0.6)"), judge=_judge_5_2()),
    Probe("5.2", "a model smaller than the first bucket, 5 GPUs",
          _with_record("predict_step_time(100_000 + _PROBE_SEED % 50_000, 5, 0.01, _probe_links['slow'])"),
          judge=_judge_5_2()),
    Probe("5.2", "weak and strong efficiency, 48 GPUs",
          _with_record("[scaling_efficiency(1.2e9 * _probe_s, 48, 0.8, _probe_links[k], weak=w, overlap=0.5) "
                       "for k in ('fast', 'slow') for w in (True, False)]"), points=2, judge=_judge_5_2()),
    Probe("5.3", "3 ranks: the shards and micro-batches, an uneven batch refused, training with them",
          '_probe_record("5.3", (micro_batches_of_rank, accumulate_and_step), ())', points=2,
          judge=replayed("5.3", COMMON, OFFSETS, ("micro_batches_of_rank", "accumulate_and_step"),
                         project=tensors_only)),
]

# The earlier answers each question's probes call, directly or through other answers, graded with the
# solution's versions bound in their place (helpers/grading/judge/reference.py): 5.3's last check trains with
# accumulate_and_step.
USES = {'5.3': ('5.1',)}
