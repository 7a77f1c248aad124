"""Runs inside the graded kernel: evaluate probe expressions, send their raw values to the grader as plain JSON.

Nothing here judges: the values go back to the grader, which compares them (helpers/grading/probes). On the
ranks a probe calls `records(ledger)` to return the collectives it saw as raw rows. In the grader's kernel the values
go by the grader's pipe, signed with the probe cell's nonce (helpers/grading/run/channel.py); a kernel without one
(tests/test_labs.py runs the probe cells in a plain notebook) displays them.
"""
import importlib
import linecache
import os
import sys

from helpers.errors import LaunchError, RankFailed
from helpers.grading.judge.plain import to_plain
from helpers.grading.run.channel import FD_VARIABLE, record, send

PROBE_MIMETYPE = "application/vnd.dp-course.probe+json"
# The grader's pipe, read once: the kernel imports this module before any student cell (sandbox.kernel_env).
_CHANNEL = int(os.environ[FD_VARIABLE]) if os.environ.get(FD_VARIABLE, "").isdigit() else None

# The functions and classes a probe cell calls in the kernel, as they were when this module was imported: the
# graded kernel imports it before any student cell runs (sandbox.kernel_env preloads it). run_probes puts them back
# first, so an answer that replaced IPython's display (a fake that rewrote the values and kept the nonce) or the
# launcher (helpers.grading.shared_run.launch_gloo, which a probe's SETUP imports after the answers ran) changes
# neither what the probes run nor what they display: two red-team submissions scored that way. These copies and
# run_probes itself an answer can only reach by naming this module or sys.modules, which the answer scan refuses
# (probes/shortcuts.py HIDING). State (the launcher's runtime) is left alone: only callables are put back.
_MACHINERY = ("IPython.display", "helpers.launch", "helpers.grading.shared_run")
_ORIGINALS = {name: {k: v for k, v in vars(importlib.import_module(name)).items() if callable(v)}
              for name in _MACHINERY}


def restore_machinery():
    """Put back every function and class of _MACHINERY's modules that student code replaced."""
    for name, originals in _ORIGINALS.items():
        vars(sys.modules[name]).update(originals)


def records(ledger, fields=("op", "payload_bytes")):
    """The ledger's records as raw rows [[op, payload_bytes], ...] (other CommRecord fields on request)."""
    return [[getattr(r, f) for f in fields] for r in ledger.records]


# JSON has no tuples: a public check's results compare tuples ((shape,), True, 0), which would come back as lists.
TUPLE = "__tuple__"


def keep_tuples(value):
    """value with every tuple as {"__tuple__": [...]} (on a rank or in the kernel, before the JSON)."""
    if isinstance(value, tuple):
        return {TUPLE: [keep_tuples(v) for v in value]}
    if isinstance(value, list):
        return [keep_tuples(v) for v in value]
    if isinstance(value, dict):
        return {k: keep_tuples(v) for k, v in value.items()}
    return value


def restore_tuples(value):
    """The inverse of keep_tuples, in the grader."""
    if isinstance(value, dict):
        if set(value) == {TUPLE} and isinstance(value[TUPLE], list):
            return tuple(restore_tuples(v) for v in value[TUPLE])
        return {k: restore_tuples(v) for k, v in value.items()}
    if isinstance(value, list):
        return [restore_tuples(v) for v in value]
    return value


# A failure message is the student's text (an exception's class name and message): it goes back in their feedback,
# so it is capped (an answer once raised a 10 KB file of an earlier grading run in one).
MESSAGE_CHARS = 500


def _evaluate(expr, namespace):
    try:
        return {"value": to_plain(eval(expr, namespace))}  # noqa: S307 - instructor-written expressions
    except NotImplementedError:
        return {"error": "not implemented"}
    except RankFailed as exc:
        if exc.exc_type == "NotImplementedError":
            return {"error": "not implemented"}
        failed = {"error": f"a rank failed: {(str(exc).splitlines() or [''])[0]}"[:MESSAGE_CHARS]}
        return {**failed, "run_failed": True} if exc.exitcode is not None else failed  # died, or raised
    except LaunchError as exc:  # a hang, a mismatch of collectives: the ranks did not finish together
        return {"error": f"{type(exc).__name__}: {exc}"[:MESSAGE_CHARS], "run_failed": True}
    except Exception as exc:  # noqa: BLE001 - every failure of student code becomes feedback
        return {"error": f"{type(exc).__name__}: {exc}"[:MESSAGE_CHARS]}


_MISSING = object()


def _forget_cell_text(frame):
    """Drop the probe cell's text (its SETUP, nonce, seed and reference source) from the kernel's line cache, where
    IPython put it for tracebacks: an answer that a probe calls could otherwise read it back through a stack summary
    (traceback.format_stack) and raise it into its feedback."""
    linecache.cache.pop(frame.f_code.co_filename, None)


def _side(namespace, name):
    value = namespace.get(name, _MISSING)
    return None if value is _MISSING else value


def _method_missing(cls_name, method):
    def missing(self, *args, **kwargs):
        raise AttributeError(f"'{cls_name}' object has no attribute '{method}': run the cell that defines it")
    return missing


def _hybrid(cls_name, how, mine, theirs):
    """A subclass of the `base` side's class whose `other` methods are the other side's (reference.py, classes)."""
    base, other = (theirs, mine) if how["base"] == "ref" else (mine, theirs)
    if base is None:
        return None
    methods = {}
    if how["base"] == "ref" and mine is not None:  # the student's own helpers (a method the lab does not name)
        methods.update({k: v for k, v in vars(mine).items() if k not in vars(theirs) and not k.startswith("__")})
    for method in how["other"]:
        found = vars(other).get(method) if other is not None and method in vars(other) else getattr(other, method, None)
        methods[method] = found if callable(found) else _method_missing(cls_name, method)
    return type(base)(base.__name__, (base,), {"__module__": base.__module__, "__qualname__": base.__qualname__,
                                              **methods})


def _bind(namespace, reference):
    """Bind the reference's globals and hybrid classes into namespace; return what to put back."""
    ref = {"__name__": "_probe_reference"}  # a module nothing imports: cloudpickle ships its functions by value
    exec(compile(reference["source"], "<probe reference>", "exec"), ref)  # noqa: S102 - the grader's solution code
    saved = {}
    for name in reference["globals"]:
        saved[name] = namespace.get(name, _MISSING)
        namespace[name] = ref[name]
    for cls_name, how in reference["classes"].items():
        saved.setdefault(cls_name, namespace.get(cls_name, _MISSING))
        hybrid = _hybrid(cls_name, how, _side(namespace, cls_name), ref.get(cls_name))
        if hybrid is not None:
            namespace[cls_name] = hybrid
    return saved


def _unbind(namespace, saved):
    for name, value in saved.items():
        if value is _MISSING:
            namespace.pop(name, None)
        else:
            namespace[name] = value


def fill_missing(reference, namespace=None):
    """Define the solution's version of each name in reference["define"] that the namespace lacks (the student's
    cell that defines it failed): the next answer cell needs it to be defined at all (`@add_to_class(FlatShard)`)."""
    if namespace is None:
        restore_machinery()
        _forget_cell_text(sys._getframe(1))
        from IPython import get_ipython

        namespace = get_ipython().user_ns
    missing = [name for name in reference["define"] if name not in namespace]
    if missing:
        ref = {"__name__": "_probe_reference"}
        exec(compile(reference["source"], "<probe reference>", "exec"), ref)  # noqa: S102 - the grader's solution
        namespace.update({name: ref[name] for name in missing})


def evaluate(namespace, setup, calls, seed, reference=None, own=True):
    """{"results": [...], "own": [...] (with a reference only)}: the probes evaluated in namespace (run_probes).

    reference: the dict, or a list holding it, which is emptied here: no frame of the grader's then holds it while an
    answer runs (an answer may walk the stack). own=False: no second run with the student's own answers (tests)."""
    namespace["_PROBE_SEED"] = seed
    if setup:
        exec(setup, namespace)  # noqa: S102 - instructor-written set-up code
    reference = reference.pop() if isinstance(reference, list) else reference
    own = own and (reference or {}).get("own", True)  # a reference may leave the student's own run out
    if reference is None:
        return {"results": [{"name": name, **_evaluate(expr, namespace)} for name, expr in calls]}
    saved = _bind(namespace, reference)
    del reference
    try:
        shown = {"results": [{"name": name, **_evaluate(expr, namespace)} for name, expr in calls]}
    finally:
        _unbind(namespace, saved)
    if not own:
        return shown
    restore_machinery()
    if setup:
        exec(setup, namespace)  # noqa: S102 - afresh: a probe's cache (lab 10) would hold the reference's run
    shown["own"] = [{"name": name, **_evaluate(expr, namespace)} for name, expr in calls]
    return shown


def run_probes(question, setup, calls, nonce, seed, reference=None):
    """Evaluate (name, expr) pairs after running setup; send the results to the grader (display them without it).

    seed: this question's secret seed, set as `_PROBE_SEED` before setup runs; the probes draw their inputs
    from it, so a submission cannot know them in advance.
    reference: for a question whose probes call earlier answers (helpers/grading/judge/reference.py), the solution's
    versions of them: the probes run with those bound in place of the student's ("results": what is scored), then
    again with the student's own ("own": what the feedback tells)."""
    restore_machinery()
    _forget_cell_text(sys._getframe(1))
    from IPython import get_ipython
    from IPython.display import display

    box = [reference]
    del reference
    shown = evaluate(get_ipython().user_ns, setup, calls, seed, box)
    if _CHANNEL is None:
        display({PROBE_MIMETYPE: {"question": question, "nonce": nonce, **shown}}, raw=True)
    else:  # signed with the nonce, which stays out of the line: nothing a student's cell replaced touches it
        send(_CHANNEL, record(nonce, {"question": question, **shown}))
