"""Runs inside the graded kernel: evaluate probe expressions, display their raw values as plain JSON.

Nothing here judges: the values go back to the grader, which compares them (helpers/grading/probes). On the
ranks a probe calls `records(ledger)` to return the collectives it saw as raw rows.
"""
import importlib
import sys

from helpers.errors import RankFailed
from helpers.grading.plain import to_plain

PROBE_MIMETYPE = "application/vnd.dp-course.probe+json"

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
        return {"error": f"a rank failed: {(str(exc).splitlines() or [''])[0]}"[:MESSAGE_CHARS]}
    except Exception as exc:  # noqa: BLE001 - every failure of student code becomes feedback
        return {"error": f"{type(exc).__name__}: {exc}"[:MESSAGE_CHARS]}


def run_probes(question, setup, calls, nonce, seed):
    """Evaluate (name, expr) pairs after running setup; display the results.

    seed: this question's secret seed, set as `_PROBE_SEED` before setup runs; the probes draw their inputs
    from it, so a submission cannot know them in advance."""
    restore_machinery()
    from IPython import get_ipython
    from IPython.display import display

    namespace = get_ipython().user_ns
    namespace["_PROBE_SEED"] = seed
    if setup:
        exec(setup, namespace)  # noqa: S102 - instructor-written set-up code
    results = [{"name": name, **_evaluate(expr, namespace)} for name, expr in calls]
    display({PROBE_MIMETYPE: {"question": question, "nonce": nonce, "results": results}}, raw=True)
