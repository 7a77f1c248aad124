"""A question's public checks recorded in the graded kernel and replayed in the grader: its hidden test and its public
check diagnose with one code path.

In the kernel, a probe's expression `_probe_record("2.2", "helpers.grading.checks.lab02.common")` runs the question's
public checks as a student's check() does, except that every launch of ranks (helpers.launch.launch, which all checks
reach) runs with the check modules' OFFSET set from the question's secret seed on every rank (other data, other
weights: an output memorised for the public inputs is worth nothing), and is recorded in order: its ranks' results,
or the launcher's exception. The record is the probe's value: raw data, what the ranks returned; the checks' own
verdicts in the kernel are thrown away. A check that raises NotImplementedError (a TODO) makes the probe "not
implemented".

In the grader, `first_failure` runs the same checks again on stand-in answers, each launch answered from the record,
in order (fresh stand-ins make the checks' memoized runs afresh), with OFFSET set in the grader's process as well, so
that the references the checks compute themselves are those of the probe's inputs. The first check that fails gives
the feedback's line, as check()'s first failed line does. A check that calls the answer itself, in the kernel, cannot
be replayed: the stand-in raises NotReplayed and the check is passed over; a question made only of such checks keeps
a probe of its own.
"""
import importlib
import threading

from helpers.errors import CollectiveHang, CollectiveMismatch, LaunchError, RankFailed
from helpers.grading.probe_runtime import keep_tuples, restore_tuples


class NotReplayed(Exception):
    """A replayed check called the answer itself (no record of that); or the record ran out."""


def _at_offset(common, offset, fn, args, kwargs):
    """On a rank: fn(*args, **kwargs) with the checks' OFFSET set."""
    module = importlib.import_module(common)
    module.OFFSET = offset
    try:
        return fn(*args, **kwargs)
    finally:
        module.OFFSET = 0


def _described(exc):
    return {"type": type(exc).__name__, "message": str(exc), "rank": getattr(exc, "rank", None),
            "exitcode": getattr(exc, "exitcode", None), "exc_type": getattr(exc, "exc_type", None)}


def _rebuilt(raised):
    message = raised.get("message", "")
    kind = raised.get("type")
    if kind == "RankFailed":
        return RankFailed(message, raised.get("rank"), raised.get("exitcode"), raised.get("exc_type"))
    if kind == "CollectiveHang":
        return CollectiveHang(message, {})
    if kind == "CollectiveMismatch":
        return CollectiveMismatch(message, {})
    return LaunchError(message)


# helpers.launch.launch, once replaced: each thread's recorder or replayer (a test records many answers at once, in
# threads), else the launcher itself.
_local = threading.local()
_active = {"count": 0}
_lock = threading.Lock()


def _dispatch(fn, world_size, **options):
    route = getattr(_local, "route", None)
    if route is None:
        return _dispatch.real(fn, world_size, **options)
    return route(fn, world_size, **options)


class _Routed:
    """Within it, this thread's launches go to route, and the check module's OFFSET is offset (until the last
    thread within leaves: the threads of a test record one question, at one offset)."""

    def __init__(self, route, common, offset):
        self.route, self.module, self.offset = route, importlib.import_module(common), offset

    def __enter__(self):
        launcher = importlib.import_module("helpers.launch")
        with _lock:
            if launcher.launch is not _dispatch:
                _dispatch.real = launcher.launch
                launcher.launch = _dispatch
            _active["count"] += 1
            self.module.OFFSET = self.offset
        _local.route = self.route
        return self

    def __exit__(self, *exc):
        _local.route = None
        with _lock:
            _active["count"] -= 1
            if not _active["count"]:
                self.module.OFFSET = 0
        return False


def record(question, namespace, common, offset):
    """[{"result": per-rank results} or {"raised": the launcher's exception}] of every launch the question's public
    checks make on the namespace (the kernel's), each with OFFSET = offset on its ranks."""
    from helpers.grading.registry import checks_for

    calls = []

    def recording(fn, world_size, *, args=(), kwargs=None, **options):
        try:
            result = _dispatch.real(_at_offset, world_size, args=(common, offset, fn, tuple(args), kwargs or {}),
                                    **options)
        except LaunchError as exc:
            calls.append({"raised": _described(exc)})
            raise
        calls.append({"result": keep_tuples(result)})
        return result

    with _Routed(recording, common, offset):
        for _, check in checks_for(question):
            try:
                check(namespace)
            except NotImplementedError:
                raise
            except RankFailed as exc:
                if exc.exc_type == "NotImplementedError":
                    raise NotImplementedError(str(exc)) from None
            except Exception:  # noqa: BLE001, S110 - the grader judges the record, not the kernel's verdict
                pass
    return calls


class _StandIn(type):
    """A stand-in answer: a class whose call, instantiation or any attribute raises NotReplayed."""

    def __call__(cls, *args, **kwargs):
        raise NotReplayed(cls.__name__)

    def __getattr__(cls, name):
        if name.startswith("__"):
            raise AttributeError(name)

        def missing(*args, **kwargs):
            raise NotReplayed(f"{cls.__name__}.{name}")
        return missing


def first_failure(question, recorded, common, offset, names, convert=None):
    """The first line of the first public check of `question` that fails on the record, or None; names: the answers
    the checks look up (stand-ins here). convert(results) rebuilds what JSON changed beyond tuples (int keys)."""
    from helpers.grading.plain import from_plain
    from helpers.grading.registry import checks_for

    calls = iter(restore_tuples(from_plain(recorded)))

    def replaying(fn, world_size, **options):
        item = next(calls, None)
        if item is None:
            raise NotReplayed("the record ran out")
        if "raised" in item:
            raise _rebuilt(item["raised"])
        result = item["result"]
        return convert(result) if convert else result

    stand_ins = {name: _StandIn(name, (), {}) for name in names}
    with _Routed(replaying, common, offset):
        for _, check in checks_for(question):
            try:
                check(dict(stand_ins))
            except AssertionError as exc:
                return (str(exc).strip().splitlines() or ["failed"])[0]
            except NotReplayed:
                continue
            except Exception:  # noqa: BLE001, S112 - a check that could not read the record: not this value's verdict
                continue
    return None
