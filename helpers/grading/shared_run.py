"""One multi-rank run shared by every public check of a question, so a question launches its ranks once."""
import inspect


def definitions(ns, *values):
    """The key of a shared run: every function and class in the student's namespace (and `values`).

    An answer may call any of them (a helper of the student's, the Reducer that lab 10's bring function returns), so
    a student who fixes any one and reruns the check cell gets a fresh run, not the stale result of the old code.
    """
    return tuple((name, value) for name, value in ns.items()
                 if inspect.isfunction(value) or inspect.isclass(value)) + values


def part_or_error(part, *args):
    """part(*args) on a rank, or {"error": ...} if the answer raised, so one shared run serves several checks and each
    check says what its own part needs. NotImplementedError passes through: check() reports it as "not implemented"."""
    try:
        return part(*args)
    except NotImplementedError:
        raise
    except Exception as exc:  # noqa: BLE001 - the answer may raise anything; the same on every rank
        return {"error": f"{type(exc).__name__}: {exc}"}


class RunFailed(AssertionError):
    """The ranks' run of a check did not complete (a hang, a deadlock, a dead rank): the launcher's report.

    check() prints it first and once, then names the checks that needed the run.
    """


class SharedRun:
    """shared(question, key, compute): compute() once per (question, key), its exception included.

    Only the latest key per question is kept: a student who edits an answer and reruns the check cell gets a new
    key (the checks build it from the answer's code), hence a fresh run. When the run failed, every check of the
    question raises the same exception object, which check() prints once.
    """

    def __init__(self):
        self._last = {}  # question -> (key, (ok, value or exception))

    def __call__(self, question, key, compute):
        if question not in self._last or self._last[question][0] != key:
            try:
                outcome = (True, compute())
            except Exception as exc:  # noqa: BLE001 - reported once for every check of the question
                outcome = (False, exc)
            self._last[question] = (key, outcome)
        ok, value = self._last[question][1]
        if not ok:
            raise value
        return value


def run_failed(exc, hint="", what=""):
    """RunFailed for a CollectiveHang or a dead rank: what was running, what to look at, the launcher's report.

    The hint (what the student most likely did, and the fix) comes first: it is the line a student reads.
    """
    what = f"{what}: " if what else ""
    failure = RunFailed(f"{what}the ranks did not finish together: {hint or 'see the report. '}"
                        f"Launcher's report: {exc}")
    failure.error = exc  # the CollectiveHang or RankFailed itself, for checks that diagnose from its reports
    return failure


# Checks and probes run on Gloo on every machine, a GPU box included: their reference values are computed on the
# CPU, their tensors are small (NCCL would add CUDA start-up to every check), and a verdict must not depend on
# the machine that grades. The GPU path of the same code is run by `make gpu-check` (helpers/gpu_check.py).
def launch_gloo(fn, world_size, *, args=(), hang_timeout=30.0, **kwargs):
    """helpers.launch on Gloo ranks: what every check and probe uses."""
    from helpers.launch import launch

    return launch(fn, world_size, args=args, hang_timeout=hang_timeout, **{**kwargs, "backend": "gloo"})


def launch_on_gloo(fn, world_size, args, hang_timeout, hint="", what=""):
    """Run fn on Gloo ranks for a check; a hang or a dead rank becomes a RunFailed that says what to look at."""
    from helpers.errors import (  # here, so that importing this module stays light
        CollectiveHang,
        RankFailed,
    )
    from helpers.launch import launch

    try:
        return launch(fn, world_size, args=args, backend="gloo", hang_timeout=hang_timeout)
    except (CollectiveHang, RankFailed) as exc:
        if isinstance(exc, RankFailed) and exc.exitcode is None:
            raise  # an exception in the student's code: its own message is the best report
        raise run_failed(exc, hint, what) from None
