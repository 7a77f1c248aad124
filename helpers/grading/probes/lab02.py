"""Hidden tests of lab 02 (collectives, ring all-reduce). Public in this repository: see the README.

Each question's probe runs its public checks in the graded kernel, every launch with the checks' OFFSET set from the
question's secret seed (other data on every rank), and returns what the ranks returned
(helpers/grading/judge/replay.py);
the grader replays the same checks on that record, so the feedback says what the check says (point-to-point messages
only, a ring's (N-1)/N S bytes, the values), and requires the solution's values (the tensors: a ring's own order of
messages may rightly differ from the solution's).
"""
from helpers.grading.probes import Probe
from helpers.grading.probes.judges import replayed, tensors_only

COMMON = "helpers.grading.checks.lab02.common"
OFFSETS = 1000  # the checks' OFFSET: the question's secret seed modulo this

SETUP = f'''
from helpers.grading.judge.replay import record as _probe_record_checks


def _probe_record(question, answers):
    """The launches of the question's public checks, with OFFSET from the secret seed; answers: the names they use."""
    return _probe_record_checks(question, globals(), {COMMON!r}, _PROBE_SEED % {OFFSETS})
'''

# The collectives each question rebuilds from point-to-point messages (a shortcut scores 0).
_COLLECTIVES = ("all_reduce", "reduce_scatter", "reduce_scatter_tensor", "all_gather", "all_gather_into_tensor",
                "all_to_all", "all_to_all_single", "broadcast", "all_gather_object", "batch_isend_irecv")
_ANSWERS = {"2.1": ("exchange_with_neighbours",), "2.2": ("ring_reduce_scatter",), "2.3": ("ring_all_gather",),
            "2.4": ("ring_all_reduce",), "2.5": ("average_gradients", "ring_all_reduce")}
_WHAT = {"2.1": "world sizes 1 to 4: both neighbours' tensors, by point-to-point messages",
         "2.2": "world sizes 1 to 4, shapes from 1 element to 1001 and 2-D, float32 and int64; a ring's bytes on 3 "
                "and 4 ranks",
         "2.3": "world sizes 1 to 4, even and uneven chunks; a ring's bytes on 3 and 4 ranks",
         "2.4": "world sizes 1 to 4, shapes from 1 element to 1001 and 2-D, float32 and int64, in place; a ring's "
                "bytes on 3 and 4 ranks",
         "2.5": "2 and 3 ranks, 3 SGD steps: identical to one process, one ring_all_reduce per step"}
_POINTS = {"2.1": 2, "2.2": 3, "2.3": 2, "2.4": 3, "2.5": 2}

PROBES = [Probe(q, _WHAT[q], f"_probe_record({q!r}, ({', '.join(_ANSWERS[q])},))", points=_POINTS[q],
                judge=replayed(q, COMMON, OFFSETS, _ANSWERS[q], project=tensors_only, atol=1e-5),
                forbidden=_COLLECTIVES)
          for q in _ANSWERS]

# The earlier answers each question's probes call, directly or through other answers, graded with the
# solution's versions bound in their place (helpers/grading/judge/reference.py): ring_all_reduce is a reduce-scatter
# then an
# all-gather; average_gradients calls ring_all_reduce.
USES = {'2.4': ('2.2', '2.3'), '2.5': ('2.2', '2.3', '2.4')}
