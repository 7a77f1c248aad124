"""Runs inside the graded kernel: evaluate probe expressions, display their raw values as plain JSON.

Nothing here judges: the values go back to the grader, which compares them (helpers/grading/probes). On the
ranks a probe calls `records(ledger)` to return the collectives it saw as raw rows.
"""
from helpers.errors import RankFailed
from helpers.grading.plain import to_plain

PROBE_MIMETYPE = "application/vnd.dp-course.probe+json"


def records(ledger, fields=("op", "payload_bytes")):
    """The ledger's records as raw rows [[op, payload_bytes], ...] (other CommRecord fields on request)."""
    return [[getattr(r, f) for f in fields] for r in ledger.records]


def _evaluate(expr, namespace):
    try:
        return {"value": to_plain(eval(expr, namespace))}  # noqa: S307 - instructor-written expressions
    except NotImplementedError:
        return {"error": "not implemented"}
    except RankFailed as exc:
        if exc.exc_type == "NotImplementedError":
            return {"error": "not implemented"}
        return {"error": f"a rank failed: {str(exc).splitlines()[0]}"}
    except Exception as exc:  # noqa: BLE001 - every failure of student code becomes feedback
        return {"error": f"{type(exc).__name__}: {exc}"[:500]}


def run_probes(question, setup, calls, nonce, seed):
    """Evaluate (name, expr) pairs after running setup; display the results.

    seed: this question's secret seed, set as `_PROBE_SEED` before setup runs; the probes draw their inputs
    from it, so a submission cannot know them in advance."""
    from IPython import get_ipython
    from IPython.display import display

    namespace = get_ipython().user_ns
    namespace["_PROBE_SEED"] = seed
    if setup:
        exec(setup, namespace)  # noqa: S102 - instructor-written set-up code
    results = [{"name": name, **_evaluate(expr, namespace)} for name, expr in calls]
    display({PROBE_MIMETYPE: {"question": question, "nonce": nonce, "results": results}}, raw=True)
