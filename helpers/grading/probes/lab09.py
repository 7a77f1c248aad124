"""Hidden tests of lab 09 (a strategy for a memory budget). Public in this repository: see the README.

9.1 and 9.2 are scored on secret inputs (models and block widths the public checks do not use); a wrong value is named
by the question's public checks replayed in the grader on the student's answers to the checks' own inputs and runs
(helpers/grading/judge/replay.py, recorded once per probe cell). 9.3 records its public checks (their nets and data
moved by the checks' OFFSET from the secret seed) and the grader replays them. 9.4 answers scenarios drawn from the
secret seed, one per branch of the lab's rules in the public check's order (q4_choose_framework.secret_scenarios), and
the grader judges every answer by those rules with the public check's own diagnosis (the first rule broken).
"""
import dataclasses

from helpers.grading.checks.lab09.q4_choose_framework import judge_answers
from helpers.grading.judge.replay import record_setup
from helpers.grading.probes import Probe
from helpers.grading.probes.judges import checked, replayed, tensors_only

COMMON = "helpers.grading.checks.lab09.common"
OFFSETS = 1000  # the checks' OFFSET: the question's secret seed modulo this
ANSWERS = {"9.1": ("choose_strategy",), "9.2": ("apply_strategy",),
           "9.3": ("train_within_budget", "choose_strategy", "apply_strategy"), "9.4": ("choose_framework",)}
ON_GPUS = 9  # 9.4's first scenarios (rules 1 to 4: a strategy fits on the GPUs); the rest offload or fit nowhere

SETUP = record_setup(COMMON, f"_PROBE_SEED % {OFFSETS}") + '''

import torch as _probe_torch
import torch.distributed as _probe_dist
import torch.nn.functional as _probe_F
from torch import nn as _probe_nn
from helpers.grading.shared_run import launch_gloo as _probe_launch
from helpers.comm import CommLedger as _probe_Ledger
from helpers.grading.checks.lab09.q4_choose_framework import secret_scenarios as _probe_scenarios


class _probe_Cell(_probe_nn.Module):
    # Another block type than the public checks': a residual MLP 7 -> 9 -> 7 (odd widths: padded shards).
    def __init__(self):
        super().__init__()
        # The hidden width comes from the secret seed (9 to 12: odd and even padding).
        self.up, self.down = _probe_nn.Linear(7, 9 + _PROBE_SEED % 4), _probe_nn.Linear(9 + _PROBE_SEED % 4, 7)

    def forward(self, x):
        return x + self.down(_probe_torch.tanh(self.up(x)))


class _probe_Model(_probe_nn.Module):
    # Blocks in two containers, and root parameters between them.
    def __init__(self):
        super().__init__()
        self.inp = _probe_nn.Linear(4, 7)
        self.encoder = _probe_nn.ModuleList([_probe_Cell(), _probe_Cell()])
        self.mid = _probe_nn.Linear(7, 7)
        self.decoder = _probe_nn.ModuleList([_probe_Cell()])
        self.out = _probe_nn.Linear(7, 2)

    def forward(self, x):
        x = self.inp(x)
        for cell in self.encoder:
            x = cell(x)
        x = self.mid(x)
        for cell in self.decoder:
            x = cell(x)
        return self.out(x)


def _probe_perm(items):
    """items in an order drawn from the question's secret seed."""
    g = _probe_torch.Generator().manual_seed(_PROBE_SEED)
    return [items[i] for i in _probe_torch.randperm(len(items), generator=g).tolist()]

def _probe_make():
    _probe_torch.manual_seed(_PROBE_SEED + 5)
    return _probe_Model()


def _probe_batches(steps):
    g = _probe_torch.Generator().manual_seed(_PROBE_SEED + 70 + _probe_dist.get_rank())
    return [(_probe_torch.randn(5, 4, generator=g), _probe_torch.randn(5, 2, generator=g)) for _ in range(steps)]


def _probe_apply(strategies):
    # Per strategy: collective calls and payload bytes of forward + backward, per phase, on rank 0's ledger.
    from torch.distributed.device_mesh import init_device_mesh
    n = _probe_dist.get_world_size()
    x, y = _probe_batches(1)[0]
    out = {}
    for strategy in strategies:
        shape = (2, n // 2) if strategy == "hybrid_shard" else (n,)
        names = ("replicate", "shard") if strategy == "hybrid_shard" else None
        mesh = init_device_mesh("cpu", shape, mesh_dim_names=names)
        model = apply_strategy(_probe_make(), mesh, strategy, (_probe_Cell,))
        summary = {}
        with _probe_Ledger() as ledger:
            with ledger.tag("forward"):
                loss = _probe_F.mse_loss(model(x), y)
            with ledger.tag("backward"):
                loss.backward()
        for r in ledger.records:
            key = f"{r.label} {r.op} over {r.group_size}"
            calls, nbytes = summary.get(key, (0, 0))
            summary[key] = (calls + 1, nbytes + r.payload_bytes)
        out[strategy] = {k: list(v) for k, v in sorted(summary.items())}
    return out


def _probe_train(budget):
    result = train_within_budget(_probe_make, _probe_batches(2), budget, lr=0.02, block_types=(_probe_Cell,))
    comm = {op: t["payload_bytes"] for op, t in sorted(result["comm"].items())}
    return {"strategy": result["strategy"], "within_budget": result["state_bytes"]["total"] <= budget,
            "comm": comm, "params": [p.float() for p in result["params"]]}


_probe_PSI = sum(p.numel() for p in _probe_make().parameters())
'''

PROBES = [
    Probe("9.1", "six models on 64 ranks, 80 GB, groups of 8",
          "[choose_strategy(b * 1e9, 64, 80e9, group_size=8) for b in _probe_perm((1, 4, 10, 38, 60, 400))]"),
    Probe("9.1", "fp32 Adam on 3 ranks, budgets around each threshold",
          "[choose_strategy(1000, 3, b, k=8, param_bytes=4, grad_bytes=4) "
          "for b in _probe_perm((16000, 15999, 8000, 5334, 5333))]"),
    Probe("9.1", "one rank: nothing to send, DDP", "choose_strategy(1e6, 1, 2e7)"),
    Probe("9.1", "groups as large as the world, no group",
          "[choose_strategy(5e9, 16, 10e9, group_size=16), choose_strategy(5e9, 16, 10e9, group_size=None)]"),
    Probe("9.2", "3 ranks: DDP, ZeRO-2, FSDP on blocks in two containers",
          "_probe_launch(_probe_apply, 3, args=(_probe_perm(('no_shard', 'shard_grad_op', 'full_shard')),), "
          "hang_timeout=20)[0]",
          points=2),
    Probe("9.2", "4 ranks: HSDP on a 2 x 2 mesh",
          "_probe_launch(_probe_apply, 4, args=(('hybrid_shard',),), hang_timeout=20)[0]", points=2),
    Probe("9.3", "3 and 2 ranks, budgets for FSDP and ZeRO-2: the strategy, the budget kept, Adam's parameters",
          '_probe_record("9.3", (train_within_budget, choose_strategy, apply_strategy), ("choose_strategy",))',
          points=4, judge=replayed("9.3", COMMON, OFFSETS, ANSWERS["9.3"], project=tensors_only)),
    Probe("9.4", "scenarios that fit on the GPUs, one per branch of rules 1 to 4",
          f"[choose_framework(s) for _, s in _probe_scenarios(_PROBE_SEED)[:{ON_GPUS}]]", points=2,
          judge=checked(lambda value, seed: judge_answers(value, seed, slice(0, ON_GPUS)))),
    Probe("9.4", "scenarios that offload or fit nowhere, one per branch of rules 5 to 8",
          f"[choose_framework(s) for _, s in _probe_scenarios(_PROBE_SEED)[{ON_GPUS}:]]",
          judge=checked(lambda value, seed: judge_answers(value, seed, slice(ON_GPUS, None)))),
]

def _recorded(probe):
    """9.1's and 9.2's probes: the value on secret inputs (scored), and the record of the public checks."""
    if probe.question in ("9.3", "9.4"):
        return probe
    answers = ANSWERS[probe.question]
    names = answers if probe.question == "9.1" else ()
    expr = (f'{{"value": {probe.expr}, "record": _probe_record({probe.question!r}, ({", ".join(answers)},), '
            f'{names!r})}}')
    return dataclasses.replace(probe, expr=expr, judge=replayed(probe.question, COMMON, OFFSETS, answers,
                                                                 record="record", project=lambda value: value["value"]))


PROBES = [_recorded(p) for p in PROBES]

# The earlier answers each question's probes call, directly or through other answers, graded with the
# solution's versions bound in their place (helpers/grading/judge/reference.py): train_within_budget calls
# choose_strategy
# and apply_strategy.
USES = {'9.3': ('9.1', '9.2')}
