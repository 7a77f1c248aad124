"""`check("3.2", globals())`: run a question's public checks and report; never raises.

The report puts first what to fix first: a failed run of the ranks (a hang, a crash) that several checks share is
printed once, followed by the checks it kept from running; then the other failures in the order the checks are
defined; then what is not implemented yet; then what passed. Lines wrap on words (JupyterLab breaks long lines
mid-word). The returned CheckResult shows nothing more in the cell: the printed summary is the summary.
"""
import dataclasses
import json

from helpers.errors import LaunchError, RankFailed
from helpers.grading.registry import checks_for
from helpers.grading.shared_run import RunFailed
from helpers.launcher.forkserver import in_kernel
from helpers.launcher.traceback_text import wrap_report

# The executed notebook keeps this mimetype's JSON, so CI reads results, not printed text.
MIMETYPE = "application/vnd.dp-course.check+json"
_MARKS = {"passed": "PASS", "failed": "FAIL", "not implemented": "TODO", "not run": "SKIP"}


@dataclasses.dataclass
class CheckResult:
    """Outcome of one question's public checks; `lines` in the order they were printed."""

    question: str
    passed: int = 0
    total: int = 0
    not_implemented: int = 0
    lines: list = dataclasses.field(default_factory=list)

    def as_dict(self):
        return dataclasses.asdict(self)

    def __repr__(self):
        return f"CheckResult({self.question}: {self.passed}/{self.total} passed)"

    def _repr_mimebundle_(self, include=None, exclude=None):
        return {"text/plain": repr(self), MIMETYPE: json.loads(json.dumps(self.as_dict()))}

    def _ipython_display_(self):
        # As a cell's last value: the machine-readable JSON only (CI reads it); the text was printed already.
        from IPython.display import display

        display({MIMETYPE: json.loads(json.dumps(self.as_dict())), "text/plain": ""}, raw=True)


def _is_not_implemented(exc):
    if isinstance(exc, NotImplementedError):
        return True
    # Student code running on ranks reaches us as RankFailed carrying the rank's exception type.
    return isinstance(exc, RankFailed) and exc.exc_type == "NotImplementedError"


def outcome(fn, namespace):
    """(status, reason, exception or None) of one check function."""
    try:
        fn(namespace)
    except Exception as exc:  # noqa: BLE001 - a check reports every failure, it never raises
        if _is_not_implemented(exc):
            return "not implemented", "not implemented yet", exc
        if isinstance(exc, AssertionError):
            return "failed", str(exc) or "assertion failed", exc
        return "failed", f"{type(exc).__name__}: {exc}", exc
    return "passed", "", None


def run_one(fn, namespace):
    """(status, reason) of one check function."""
    return outcome(fn, namespace)[:2]


def _is_run_failure(exc, shared):
    """A failure of the ranks' run itself: the launcher's report, or one exception that several checks share."""
    return isinstance(exc, RunFailed) or id(exc) in shared


def report_lines(question, outcomes):
    """The report's lines, first thing to fix first; outcomes are (name, status, reason, exception)."""
    seen = {}
    for name, status, _, exc in outcomes:
        if status == "failed":
            seen.setdefault(id(exc), []).append(name)
    shared = {key for key, names in seen.items() if len(names) > 1}
    runs, fails, todo, passes, done = [], [], [], [], set()
    for name, status, reason, exc in outcomes:
        if status == "failed" and _is_run_failure(exc, shared):
            if id(exc) in done:
                continue
            done.add(id(exc))
            runs.append(f"[FAIL] {question} {name}: {reason}")
            others = seen[id(exc)][1:]
            if others:
                need = "it needs" if len(others) == 1 else "they need"
                runs.append(f"[SKIP] {question} {', '.join(others)}: not run, {need} the run of the ranks that "
                            "failed above")
        elif status == "failed":
            fails.append(f"[FAIL] {question} {name}: {reason}")
        elif status == "not implemented":
            todo.append(f"[TODO] {question} {name}")
        else:
            passes.append(f"[PASS] {question} {name}")
    return runs + fails + todo + passes


def warm_up():
    """Start the ranks' forkserver now, in the background: its preload (torch, torch._dynamo) takes 4-6 s, which
    the first multi-rank check would otherwise wait for. Takes about 0.02 s; never fails a check."""
    from helpers.launch import warm_up as start_forkserver

    try:
        start_forkserver()
    except (LaunchError, OSError):
        pass  # no forkserver here (Windows): the check that launches says so


def check(question, namespace):
    """Run the public checks of `question` against the notebook's namespace and print the report."""
    if in_kernel():  # a script or a test starts the forkserver at its first launch: a TODO's checks launch none
        warm_up()
    result = CheckResult(question)
    try:
        checks = checks_for(question)
    except ValueError as exc:
        print(f"check({question!r}): {exc}")
        return result
    outcomes = [(name, *outcome(fn, namespace)) for name, fn in checks]
    result.total = len(outcomes)
    result.passed = sum(status == "passed" for _, status, _, _ in outcomes)
    result.not_implemented = sum(status == "not implemented" for _, status, _, _ in outcomes)
    result.lines = report_lines(question, outcomes)
    todo = f", {result.not_implemented} not implemented yet" if result.not_implemented else ""
    summary = [f"{question}: {result.passed}/{result.total} public checks passed{todo}.",
               "Public checks only: the graded (hidden) tests are run separately."]
    print(wrap_report("\n".join(result.lines + summary)))
    return result


# A notebook that imports check() runs multi-rank checks soon: start the forkserver while the student reads and
# writes the first answer. Only in a Jupyter kernel: scripts, tests and the grader's host process start it on use.
if in_kernel():
    warm_up()
