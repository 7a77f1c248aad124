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
import inspect
import threading

from helpers.errors import CollectiveHang, CollectiveMismatch, LaunchError, RankFailed
from helpers.grading.run.probe_runtime import keep_tuples, restore_tuples


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


def _recording(fn, calls):
    """fn, its results (or its exceptions) appended to calls: an answer the checks call in the kernel."""
    def answer(*args, **kwargs):
        try:
            result = fn(*args, **kwargs)
        except NotImplementedError:
            raise
        except Exception as exc:
            calls.append({"raised": {"type": type(exc).__name__, "message": str(exc)}})
            raise
        calls.append({"result": keep_tuples(result)})
        return result
    answer.__name__, answer.__qualname__, answer.__doc__ = fn.__name__, fn.__qualname__, fn.__doc__
    return answer


def record(question, namespace, common, offset, answers=()):
    """{"launches": [{"result": per-rank results} or {"raised": the launcher's exception}], "calls": {name: [...]}}:
    every launch the question's public checks make on the namespace (the kernel's), each with OFFSET = offset on its
    ranks, and every call they make in the kernel to one of `answers` that is a function (its result, or its
    exception)."""
    from helpers.grading.registry import checks_for

    launches = []

    def recording(fn, world_size, *, args=(), kwargs=None, **options):
        try:
            result = _dispatch.real(_at_offset, world_size, args=(common, offset, fn, tuple(args), kwargs or {}),
                                    **options)
        except LaunchError as exc:
            launches.append({"raised": _described(exc)})
            raise
        launches.append({"result": keep_tuples(result)})
        return result

    recorded = [name for name in answers if inspect.isfunction(namespace.get(name))]
    calls = {name: [] for name in recorded}
    seen = {**namespace, **{name: _recording(namespace[name], calls[name]) for name in recorded}}
    # A function of its own: the checks' memoized runs, keyed by every function and class in reach, run afresh (a
    # public check cell run before would have left its run, at OFFSET 0).
    seen["_probe_record_run"] = lambda: None
    with _Routed(recording, common, offset):
        for _, check in checks_for(question):
            try:
                check(seen)
            except NotImplementedError:
                raise
            except RankFailed as exc:
                if exc.exc_type == "NotImplementedError":
                    raise NotImplementedError(str(exc)) from None
            except Exception:  # noqa: BLE001, S110 - the grader judges the record, not the kernel's verdict
                pass
    return {"launches": launches, "calls": calls}


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


def _raised(raised):
    """An exception like the one recorded: the builtin of that name (ValueError...), else an Exception saying it."""
    import builtins

    kind = getattr(builtins, raised.get("type", ""), None)
    if isinstance(kind, type) and issubclass(kind, Exception):
        return kind(raised.get("message", ""))
    return Exception(f"{raised.get('type')}: {raised.get('message', '')}")


def _int_keys(value):
    """JSON made a dict's int keys text ({3: ...} -> {"3": ...}): back to ints."""
    if isinstance(value, dict):
        return {int(k) if isinstance(k, str) and k.lstrip("-").isdigit() else k: _int_keys(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_int_keys(v) for v in value)
    return value


def first_failure(question, recorded, common, offset, names, convert=None, given=None):
    """The first line of the first public check of `question` that fails on the record, or None; names: the answers
    the checks look up (stand-ins here: one whose calls were recorded answers from them, in order; any other raises
    NotReplayed when used). convert(results) rebuilds what JSON changed beyond tuples (int keys); given: the lab's own
    definitions the checks use in the kernel (a given class they build a reference with), the released lab's."""
    from helpers.grading.judge.plain import from_plain

    record_ = _int_keys(restore_tuples(from_plain(recorded)))
    launches = iter(record_.get("launches", []))
    calls = record_.get("calls") if isinstance(record_.get("calls"), dict) else {}

    def replaying(fn, world_size, **options):
        item = next(launches, None)
        if item is None:
            raise NotReplayed("the record ran out")
        if "raised" in item:
            raise _rebuilt(item["raised"])
        result = item["result"]
        return convert(result) if convert else result

    def answering(items):
        def answered(*args, **kwargs):
            item = next(items, None)
            if item is None:
                raise NotReplayed("the record ran out")
            if "raised" in item:
                raise _raised(item["raised"])
            return item["result"]
        return answered

    stand_ins = {name: answering(iter(calls[name])) if isinstance(calls.get(name), list) else _StandIn(name, (), {})
                 for name in names}
    stand_ins.update(given or {})
    with _Routed(replaying, common, offset):
        return first_line(question, lambda check: check(dict(stand_ins)))


def first_line(question, run):
    """The reason of the first [FAIL] line check() would print for the question's checks, each run as run(check):
    a failed run of the ranks first, then the other failures in the checks' order (check.report_lines); None if none
    fails. A check that raises NotReplayed (it calls an answer the record holds no call of) is passed over; any other
    exception fails it, as check() reports it."""
    from helpers.grading.check import report_lines
    from helpers.grading.registry import checks_for

    outcomes = []
    for name, check in checks_for(question):
        try:
            run(check)
        except AssertionError as exc:
            outcomes.append((name, "failed", str(exc) or "assertion failed", exc))
        except NotReplayed:
            continue
        except Exception as exc:  # noqa: BLE001 - as check() reports it: the answer's own exception, recorded
            outcomes.append((name, "failed", f"{type(exc).__name__}: {exc}", exc))
    failed = [line for line in report_lines(question, outcomes) if line.startswith("[FAIL]")]
    if not failed:
        return None
    reason = failed[0].split(": ", 1)[1] if ": " in failed[0] else failed[0]
    return (reason.strip().splitlines() or ["failed"])[0]


def record_setup(common, offset):
    """Probe SETUP lines defining _probe_record(question, answers, names) in the graded kernel: the record of the
    question's public checks (launches and calls of the answers `names`), made once a cell, with the checks' OFFSET
    set to `offset` (source text: "_PROBE_SEED % 1000" for secret inputs, "0" for the checks' own)."""
    return f'''
from helpers.grading.judge.replay import record as _probe_record_checks

_probe_records = {{}}


def _probe_record(question, answers, names):
    """The public checks' launches and calls of the answers (names), with OFFSET {offset}: once a cell."""
    if question not in _probe_records:
        _probe_records[question] = _probe_record_checks(question, globals(), {common!r}, {offset}, names)
    return _probe_records[question]
'''
