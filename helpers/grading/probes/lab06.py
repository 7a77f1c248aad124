"""Hidden tests of lab 06: the formulas on inputs the public checks do not use, and the replica (6.4).

6.1 to 6.3 are scored on secret inputs; a wrong value is named by the question's public checks, replayed in the
grader on the student's answers to the checks' own inputs (helpers/grading/judge/replay.py). 6.4 records its public
check
(3 ranks, each replica's weights and data moved by the checks' OFFSET from the secret seed) and the grader replays it.
"""
import dataclasses

from helpers.grading.judge.replay import record_setup
from helpers.grading.probes import Probe
from helpers.grading.probes.judges import replayed, tensors_only

COMMON = "helpers.grading.checks.lab06.common"
OFFSETS = 1000  # the checks' OFFSET: the question's secret seed modulo this
ANSWERS = {"6.1": "model_state_bytes", "6.2": "largest_model", "6.3": "activation_bytes", "6.4": "train_replica"}

SETUP = record_setup(COMMON, f"_PROBE_SEED % {OFFSETS}") + '''

import torch as _probe_torch
import torch.distributed as _probe_dist
from helpers.grading.shared_run import launch_gloo as _probe_launch
# Inputs scale with the question's secret seed: an output memorised for one call is worth nothing.
_probe_s = 1 + (_PROBE_SEED % 997) / 997


def _probe_arithmetic(fn, *args, **kwargs):
    """fn(*args, **kwargs) with every torch call refused, as the public check's GPT-3-sized block is computed."""
    from helpers.grading.checks.lab06.q3_activation_bytes import _NoTorch
    with _NoTorch():
        return fn(*args, **kwargs)


'''


PROBES = [
    # 6.1: odd world sizes and non-default conventions
    Probe("6.1", "ZeRO-2 on 5 devices, fp32 gradients",
          "model_state_bytes(3.3e9 * _probe_s, 5, 2, param_bytes=2, grad_bytes=4, optimizer_bytes=12)"),
    Probe("6.1", "every stage on 7 devices, fp32 Adam",
          "[model_state_bytes(1e9 * _probe_s, 7, s, param_bytes=4, grad_bytes=4, optimizer_bytes=8) "
          "for s in range(4)]"),
    Probe("6.1", "every stage on one device",
          "[model_state_bytes(123_456_789 + _PROBE_SEED, 1, s) for s in range(4)]"),
    Probe("6.1", "SGD with momentum, ZeRO-1 on 3 devices",
          "model_state_bytes(2.5e10 * _probe_s, 3, 1, param_bytes=2, grad_bytes=2, optimizer_bytes=8)"),
    # 6.2
    Probe("6.2", "80 GB, ZeRO-3 on 8 devices", "largest_model(80e9 * _probe_s, 8, 3)"),
    Probe("6.2", "24 GB with 4 GB reserved, ZeRO-2 on 3 devices, fp32 gradients",
          "largest_model(24e9 * _probe_s, 3, 2, reserved_bytes=4e9, param_bytes=2, grad_bytes=4, optimizer_bytes=12)"),
    Probe("6.2", "40 GB, ZeRO-1 on 7 devices, fp32 Adam",
          "largest_model(40e9 * _probe_s, 7, 1, param_bytes=4, grad_bytes=4, optimizer_bytes=8)"),
    Probe("6.2", "nothing fits",
          "[largest_model(1e9 * _probe_s, 1, 0, reserved_bytes=2e9 * _probe_s), "
          "largest_model(1e9 * _probe_s, 1, 0)]"),
    # 6.3
    Probe("6.3", "one GELU block, odd sizes", "activation_bytes(3 + _PROBE_SEED % 4, 7, 12, 3, 20)"),
    Probe("6.3", "two ReLU blocks",
          "activation_bytes(2 + _PROBE_SEED % 3, 9, 16, 4, 24, n_layers=2, activation='relu')"),
    # Arithmetic only, as the public check's GPT-3 block: a model of this size built to be measured costs 30 s here.
    Probe("6.3", "GPT-2 small, 12 layers",
          "_probe_arithmetic(activation_bytes, 8 + _PROBE_SEED % 4, 1024, 768, 12, 3072, n_layers=12)"),
    Probe("6.4", "3 ranks, different weights and data: identical replicas equal to one process, the bytes held",
          '_probe_record("6.4", (train_replica, model_state_bytes), ("model_state_bytes",))', points=3,
          judge=replayed("6.4", COMMON, OFFSETS, ("train_replica", "model_state_bytes"), project=tensors_only)),
]

def _recorded(probe):
    """A formula's probe: its value on the secret inputs (scored), and the record of the public checks' calls."""
    if probe.question == "6.4":
        return probe
    answer = ANSWERS[probe.question]
    expr = (f'{{"value": {probe.expr}, "record": _probe_record({probe.question!r}, {answer}, ({answer!r},))}}')
    return dataclasses.replace(probe, expr=expr, judge=replayed(probe.question, COMMON, OFFSETS, (answer,),
                                                                 record="record", project=lambda value: value["value"]))


PROBES = [_recorded(p) for p in PROBES]

# Using the course's own formulas scores 0 on the questions that rebuild it.
_FORBIDDEN = ("helpers.theory", "helpers.theory_comm", "helpers.widgets")
PROBES = [dataclasses.replace(p, forbidden=_FORBIDDEN) if p.question in ('6.1', '6.2', '6.3') else p for p in PROBES]

# The earlier answers each question's probes call, directly or through other answers, graded with the
# solution's versions bound in their place (helpers/grading/judge/reference.py): largest_model searches with
# model_state_bytes; 6.4's check compares the bytes a replica holds with model_state_bytes.
USES = {'6.2': ('6.1',), '6.4': ('6.1',)}
