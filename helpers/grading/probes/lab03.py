"""Hidden tests of lab 03 (manual DDP). Public in this repository: see the README.

3.2 to 3.4 run the public checks' own rank functions on inputs drawn from the question's secret seed (the models'
initialisation, the data, the shuffling seed), and 3.1 calls shard_indices on secret sizes; a value that is not the
solution's is then diagnosed by the public check's own rule (its `diagnose`), so the feedback names the same mistake
the check names, without a value of the right answer.
"""
from helpers.grading.checks.lab03 import q1_shard_indices as q1
from helpers.grading.checks.lab03 import q2_broadcast_parameters as q2
from helpers.grading.checks.lab03 import q3_average_gradients as q3
from helpers.grading.checks.lab03 import q4_train_manual_ddp as q4
from helpers.grading.judge.plain import from_plain
from helpers.grading.probes import Probe
from helpers.grading.probes.judges import diagnosed

# 3.4's initialisations, data and shuffling seed move by the secret seed modulo this.
OFFSETS = 1000

SETUP = '''
from helpers.errors import CollectiveHang as _probe_Hang, RankFailed as _probe_RankFailed
from helpers.grading.shared_run import launch_gloo as _probe_launch
from helpers.grading.checks.lab03 import (q2_broadcast_parameters as _probe_q2, q3_average_gradients as _probe_q3,
                                          q4_train_manual_ddp as _probe_q4)


def _probe_shards(cases):
    """Each call's arguments (num_samples, rank, world_size, shuffle, seed, epoch, drop_last) and what it returned."""
    return [{"args": list(c), "got": shard_indices(c[0], c[1], c[2], shuffle=c[3], seed=c[4], epoch=c[5],
                                                  drop_last=c[6])} for c in cases]


def _probe_ranks(num_samples, world_size):
    """Ranks world_size and -1: the name of what each raised ("returned" if nothing); then the last valid rank's."""
    refused = []
    for rank in (world_size, -1):
        try:
            shard_indices(num_samples, rank, world_size, shuffle=True, seed=_PROBE_SEED, epoch=0, drop_last=False)
            refused.append("returned")
        except NotImplementedError:
            raise
        except Exception as exc:
            refused.append(type(exc).__name__)
    last = shard_indices(num_samples, world_size - 1, world_size, shuffle=True, seed=_PROBE_SEED, epoch=0,
                         drop_last=False)
    return {"refused": refused, "last rank": last}


def _probe_average():
    """3.3's check's two runs: every rank with every gradient, then rank 1 without one (None if it did not finish)."""
    every = _probe_launch(_probe_q3._average_on_rank, 3, args=(average_gradients, False, _PROBE_SEED),
                          hang_timeout=10)
    try:
        drop = _probe_launch(_probe_q3._average_on_rank, 3, args=(average_gradients, True, _PROBE_SEED),
                             hang_timeout=10)
    except _probe_RankFailed as exc:
        if exc.exitcode is None:
            raise  # the answer raised: its own message is the feedback
        drop = None
    except _probe_Hang:
        drop = None
    return {"every": every, "drop": drop}
'''


def _shards(expected, actual, seed):
    """The first call whose indices the check's rule recognises as a usual mistake (q1._diagnose)."""
    for want, mine in zip(expected, actual):
        if mine.get("got") != want["got"]:
            why = q1._diagnose([int(i) for i in mine["got"]], *want["args"])
            if why:
                return why
    return None


def _ranks(expected, actual, seed):
    if actual["refused"] != expected["refused"]:
        return f"shard_indices with a rank outside 0 .. world_size - 1 {q1.RANK_REFUSED}"
    return None


def _broadcast(expected, actual, seed):
    return q2.diagnose({src: [from_plain(rank[key]) for rank in actual] for src, key in ((1, "1"), (None, "None"))})


def _average(expected, actual, seed):
    drop = actual["drop"]
    return q3.diagnose(from_plain(actual["every"]), None if drop is None else from_plain(drop))


def _training(expected, actual, seed):
    return q4.diagnose(from_plain(actual), seed % OFFSETS)


# What 3.1 rebuilds (DistributedSampler) and what 3.2-3.4 rebuild (DistributedDataParallel).
_SAMPLER, _DDP = ("DistributedSampler",), ("DistributedDataParallel",)

PROBES = [
    # Sizes and seeds come from the question's secret seed: outputs memorised for one call are worth nothing.
    Probe("3.1", "11-15 samples, rank 2 of 3, shuffled, epoch 3",
          "_probe_shards([(11 + _PROBE_SEED % 5, 2, 3, True, _PROBE_SEED, 3, False)])", forbidden=_SAMPLER,
          judge=diagnosed(_shards)),
    Probe("3.1", "2-4 samples on 5 ranks (padding wraps)",
          "_probe_shards([(2 + _PROBE_SEED % 3, r, 5, True, _PROBE_SEED, 0, False) for r in range(5)])",
          forbidden=_SAMPLER, judge=diagnosed(_shards)),
    Probe("3.1", "10-12 samples, 4 ranks, drop_last",
          "_probe_shards([(10 + _PROBE_SEED % 3, r, 4, True, _PROBE_SEED, 1, True) for r in range(4)])",
          forbidden=_SAMPLER, judge=diagnosed(_shards)),
    Probe("3.1", "ranks world_size and -1 refused, rank world_size - 1 served, 3-5 ranks",
          "_probe_ranks(10, 3 + _PROBE_SEED % 3)", forbidden=_SAMPLER, judge=diagnosed(_ranks)),
    Probe("3.2", "3 ranks, from rank 1 and from the default, with BatchNorm buffers",
          "_probe_launch(_probe_q2._broadcast_on_rank, 3, args=(broadcast_parameters, _PROBE_SEED), hang_timeout=10)",
          points=2, forbidden=_DDP, judge=diagnosed(_broadcast), hint=q2.HINT),
    Probe("3.3", "3 ranks, a frozen layer, then a gradient missing on rank 1: the mean, with one all_reduce",
          "_probe_average()", points=2, forbidden=_DDP, judge=diagnosed(_average), hint=q3.HINT),
    Probe("3.4", "3 ranks, 29 samples, 2 epochs",
          f"_probe_launch(_probe_q4._train_on_rank, 3, args=(train_manual_ddp, _PROBE_SEED % {OFFSETS}), "
          "hang_timeout=20)", points=3, forbidden=_DDP, judge=diagnosed(_training), hint=q4.HINT),
]

# The earlier answers each question's probes call, directly or through other answers, graded with the
# solution's versions bound in their place (helpers/grading/judge/reference.py): train_manual_ddp calls shard_indices,
# broadcast_parameters and average_gradients.
USES = {'3.4': ('3.1', '3.2', '3.3')}
