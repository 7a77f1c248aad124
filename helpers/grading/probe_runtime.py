"""Runs inside the graded kernel: evaluate probe expressions, display their values as plain JSON."""
from IPython import get_ipython
from IPython.display import display

from helpers.errors import RankFailed
from helpers.grading.plain import to_plain

PROBE_MIMETYPE = "application/vnd.dp-course.probe+json"


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


def run_probes(question, setup, calls, nonce, seed=0):
    """Evaluate (name, expr) pairs after running setup; display the results.

    `_PROBE_SEED` (this question's secret seed) is set first: the probes draw their inputs from it, so a
    submission cannot know them in advance."""
    namespace = get_ipython().user_ns
    namespace["_PROBE_SEED"] = seed
    if setup:
        exec(setup, namespace)  # noqa: S102 - instructor-written set-up code
    results = [{"name": name, **_evaluate(expr, namespace)} for name, expr in calls]
    display({PROBE_MIMETYPE: {"question": question, "nonce": nonce, "results": results}}, raw=True)
