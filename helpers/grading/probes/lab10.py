"""Hidden tests of lab 10 (the capstone with the student's own components). Public in this repository: see the README.

Each question trains chapter 10's GPT once with the student's component (`capstone.yours.train`, the public checks'
rank function) on the checks' 3 ranks, at sizes drawn from the question's secret seed (initialisation, context
length, width), and returns every rank's results. The grader runs the question's public checks on that run, with the
solution's run for the same seed in the place of PyTorch's counterpart (the solution is the reference; the two agree
within the checks' tolerances), so the feedback says what the check says; and it requires the solution's values
(within what summation order explains), collectives and bytes held (exactly).

10.5 runs the student's hooks on the solution's FlatShard (USES): a broken 10.3 costs 10.3 only. Its judge also reads
the order in which every rank issued its collectives (the public checks' prefetch rule).

The report's analysis (10.4) is graded by hand: MANUAL below; INSTRUCTORS.md has its rubric.
"""
from helpers.grading.checks.lab10 import q1_reducer as q1
from helpers.grading.checks.lab10 import q2_zero2 as q2
from helpers.grading.checks.lab10 import q3_flat_shard as q3
from helpers.grading.checks.lab10 import q5_prefetch as q5
from helpers.grading.probes import Manual, Probe

SETUP = '''
# The ranks train with torch.optim.AdamW (capstone/yours.py): the grader preloads torch._dynamo for them (grade.py).
from helpers.grading.shared_run import launch_gloo as _probe_launch
from helpers.grading.checks.lab10 import common as _probe_lab10


def _probe_run(question, kind, name, bring, valid, what, n_layer):
    """The student's run at secret sizes on the checks' 3 ranks, the component first looked at as the check does
    (a bring function that returns nothing says so): every rank's results but its timings."""
    component = _probe_lab10.brought({name: bring}, name, question, valid, what)
    cfg = _probe_lab10.config(seed=_PROBE_SEED % 1000, steps=2, block_size=6 + _PROBE_SEED % 7,
                              n_embd=8 + 4 * (_PROBE_SEED % 3), n_layer=n_layer, bucket_cap_mb=2 / 1024)
    data = _probe_lab10._capstone("data").load_corpus()[1]
    runs = _probe_launch(_probe_lab10._train_on_rank, _probe_lab10.WORLD_SIZE, args=(kind, component, data, cfg),
                         hang_timeout=30)
    return [{k: v for k, v in run.items() if k not in ("kind", "seconds")} for run in runs]


def _probe_prefetch(FlatShard, register):
    """10.5: the student's hooks on FlatShard units (the solution's 10.3 class in the graded run), a GPT of 2 or 3
    blocks at secret sizes; every rank's results but its timings, and the order of its collectives in every step."""
    cfg = _probe_lab10.config(seed=_PROBE_SEED % 1000, steps=2, block_size=6 + _PROBE_SEED % 7,
                              n_embd=8 + 4 * (_PROBE_SEED % 3), n_layer=2 + _PROBE_SEED // 7 % 2)
    data = _probe_lab10._capstone("data").load_corpus()[1]
    runs = _probe_launch(_probe_lab10._train_with_hooks, _probe_lab10.WORLD_SIZE, args=(FlatShard, register, data, cfg),
                         hang_timeout=30)
    return [{k: v for k, v in run.items() if k not in ("kind", "seconds")} for run in runs]
'''


def _judge_values(expected, actual, seed):
    """Every rank's parameters identical; rank 0's losses, gradient and parameters those of the solution's run."""
    from helpers.grading.judge.plain import compare

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


def _digested(runs):
    """What _judge_values reads of a run: a digest of every rank's parameters, rank 0's values."""
    import hashlib

    return {"digests": [hashlib.sha256(repr(r["params"]["data"]).encode()).hexdigest() for r in runs],
            "params": runs[0]["params"], "losses": runs[0]["losses"], "grads": runs[0]["grads"]}


def _by_checks(question, module):
    """The question's public checks run in the grader on the student's run, the solution's run in PyTorch's place
    (the two agree within the checks' tolerances): their first failure is the feedback's line. Then the solution's
    values (within what summation order explains), and its collectives and bytes held, exactly."""
    def judge(expected, actual, seed):
        from helpers.grading.judge.plain import compare, from_plain
        from helpers.grading.judge.replay import first_line

        mine, theirs = from_plain(actual), from_plain(expected)
        original = module._runs
        module._runs = lambda ns: (mine, theirs)
        try:
            why = first_line(question, lambda check: check({}))
        finally:
            module._runs = original
        if why:
            return False, why
        ok, message = _judge_values(_digested(expected), _digested(actual), seed)
        if not ok:
            return ok, message
        return compare([[r["comm"], r["state"]] for r in expected], [[r["comm"], r["state"]] for r in actual])
    return judge


# The library implementation each question's component replaces: using it scores 0 (shortcuts.py).
_FORBIDDEN = {"10.1": ("DistributedDataParallel",),
              "10.2": ("ZeroRedundancyOptimizer", "DistributedDataParallel"),
              "10.3": ("fully_shard", "FullyShardedDataParallel"),
              "10.5": ("fully_shard", "FullyShardedDataParallel")}
_RUNS = {"10.1": '_probe_run("10.1", "reducer", "bring_reducer", bring_reducer, lambda c: isinstance(c, type), '
                 '"return the class itself: end bring_reducer with `return Reducer`", 1)',
         "10.2": '_probe_run("10.2", "zero2", "bring_zero2", bring_zero2, lambda c: isinstance(c, tuple) and len(c) '
                 '== 2 and all(callable(f) for f in c), "end bring_zero2 with `return reduce_scatter_gradients, '
                 'zero_adamw_step`, the two functions themselves", 1)',
         "10.3": '_probe_run("10.3", "flatshard", "bring_flat_shard", bring_flat_shard, lambda c: isinstance(c, '
                 'type), "return the class itself: end bring_flat_shard with `return FlatShard`", 2)',
         "10.5": '_probe_prefetch(bring_flat_shard(), register_hooks_with_prefetch)'}
_WHERE = {"10.1": "3 ranks, a GPT of secret sizes, 2 steps", "10.2": "3 ranks, a GPT of secret sizes, 2 steps",
          "10.3": "3 ranks, a GPT of 2 blocks and secret sizes, 2 steps",
          "10.5": "3 ranks, a GPT of 2 or 3 blocks and secret sizes, 2 steps, your hooks on the reference FlatShard"}
_POINTS = {"10.1": 3, "10.2": 4, "10.3": 4, "10.5": 4}
_MODULES = {"10.1": q1, "10.2": q2, "10.3": q3, "10.5": q5}
_WHAT = {"10.5": "identical parameters on every rank, the solution's values, every collective in the order each rank "
                 "issued it (backward prefetch), their bytes, the bytes held between steps"}

PROBES = [Probe(q, f"{_WHERE[q]}: " + _WHAT.get(q, "identical parameters on every rank, the solution's values, the "
                                                   "collectives every rank issued in every step and their bytes"
                                                   + (", the bytes held between steps" if q != "10.1" else "")),
                _RUNS[q], points=_POINTS[q], judge=_by_checks(q, _MODULES[q]), forbidden=_FORBIDDEN[q],
                hint=_MODULES[q].HINT, errors=((q5.FREED_ERROR, q5.FREED),) if q == "10.5" else ())
          for q in ("10.1", "10.2", "10.3", "10.5")]

MANUAL = [Manual("10.4", "the report's analysis: two paragraphs on your measurements (rubric: INSTRUCTORS.md, lab 10)",
                 points=6, cell="report-analysis")]

# 10.5's hooks run on the FlatShard of 10.3: graded with the solution's (helpers/grading/judge/reference.py).
USES = {"10.5": ("10.3",)}
