"""Hidden tests of lab 10 (the capstone with the student's own components). Public in this repository: see the README.

Each question trains chapter 10's GPT once per probe cell with the student's component (`capstone.yours.train`),
at sizes drawn from the question's secret seed (initialisation, context length, width), and its probes read parts
of that one run: the parameters (a digest per rank, rank 0's values), the losses and the first mean gradient; the
collectives every rank issued per step (CommLedger totals); the bytes a rank holds between steps. The grader
compares them with the solution's run for the same seed: values within what summation order explains, collectives
and bytes exactly. PyTorch's counterparts run in the public checks, not here: the solution is the reference.

The report's analysis (10.4) is graded by hand: MANUAL below; INSTRUCTORS.md has its rubric.
"""
from helpers.grading.probes import Manual, Probe

SETUP = '''
# The ranks train with torch.optim.AdamW (capstone/yours.py): the grader preloads torch._dynamo for them (grade.py).
import hashlib as _probe_hashlib
from helpers.grading.shared_run import launch_gloo as _probe_launch
from helpers.grading.checks.lab10 import common as _probe_lab10

_probe_cache = {}


def _probe_run(kind, bring, world_size, n_layer):
    """The student's run at secret sizes: launched once per probe cell (a failure too), read by every probe."""
    if kind not in _probe_cache:
        cfg = _probe_lab10.config(seed=_PROBE_SEED % 1000, steps=2, block_size=6 + _PROBE_SEED % 7,
                                  n_embd=8 + 4 * (_PROBE_SEED % 3), n_layer=n_layer, bucket_cap_mb=2 / 1024)
        data = _probe_lab10._capstone("data").load_corpus()[1]
        try:
            _probe_cache[kind] = _probe_launch(_probe_lab10._train_on_rank, world_size,
                                               args=(kind, bring(), data, cfg), hang_timeout=30)
        except Exception as exc:
            _probe_cache[kind] = exc
    if isinstance(_probe_cache[kind], Exception):
        raise _probe_cache[kind]
    return _probe_cache[kind]


def _probe_values(runs):
    """Raw: a digest of every rank's parameters, rank 0's parameters, losses and first mean gradient."""
    return {"digests": [_probe_hashlib.sha256(r["params"].numpy().tobytes()).hexdigest() for r in runs],
            "params": runs[0]["params"], "losses": runs[0]["losses"], "grads": runs[0]["grads"]}


def _probe_comm(runs):
    return [r["comm"] for r in runs]


def _probe_state(runs):
    return [r["state"] for r in runs]
'''


def _judge_values(expected, actual, seed):
    """Every rank's parameters identical; rank 0's losses, gradient and parameters those of the solution's run."""
    from helpers.grading.plain import compare

    try:
        digests = actual["digests"]
        if len(set(digests)) != 1:
            return False, "the ranks end with different parameters"
        for key, rtol, atol, what in (("grads", 1e-4, 1e-6, "the first step's mean gradient"),
                                      ("losses", 0, 1e-5, "the losses"),
                                      ("params", 0, 2e-4, "the final parameters")):
            ok, message = compare(expected[key], actual[key], rtol, atol)
            if not ok:
                return False, f"{what}: {message}"
    except (KeyError, TypeError):
        return False, "the run returned something else than the lab's harness does"
    return True, ""


# The library implementation each question's component replaces: using it scores 0 (shortcuts.py).
_FORBIDDEN = {"10.1": ("DistributedDataParallel",),
              "10.2": ("ZeroRedundancyOptimizer", "DistributedDataParallel"),
              "10.3": ("fully_shard", "FullyShardedDataParallel")}
_RUNS = {"10.1": '_probe_run("reducer", bring_reducer, 2, 1)',
         "10.2": '_probe_run("zero2", bring_zero2, 3, 1)',
         "10.3": '_probe_run("flatshard", bring_flat_shard, 3, 2)'}
_WHERE = {"10.1": "2 ranks, a GPT of secret sizes, 2 steps", "10.2": "3 ranks, a GPT of secret sizes, 2 steps",
          "10.3": "3 ranks, a GPT of 2 blocks and secret sizes, 2 steps"}

PROBES = []
for _q in ("10.1", "10.2", "10.3"):
    PROBES.append(Probe(_q, f"{_WHERE[_q]}: identical parameters on every rank, the solution's values",
                        f"_probe_values({_RUNS[_q]})", points=2, judge=_judge_values, forbidden=_FORBIDDEN[_q]))
    PROBES.append(Probe(_q, "the collectives every rank issued in every step, and their bytes",
                        f"_probe_comm({_RUNS[_q]})", forbidden=_FORBIDDEN[_q]))
    if _q != "10.1":  # a Reducer holds what DDP holds; ZeRO-2 and FlatShard hold shards
        PROBES.append(Probe(_q, "the bytes every rank holds between steps", f"_probe_state({_RUNS[_q]})",
                            forbidden=_FORBIDDEN[_q]))

MANUAL = [Manual("10.4", "the report's analysis: two paragraphs on your measurements (rubric: INSTRUCTORS.md, lab 10)",
                 points=6, cell="report-analysis")]

# No question's probes call another question's answer (helpers/grading/reference.py).
USES = {}
