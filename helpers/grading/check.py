"""`check("3.2", globals())`: run a question's public checks and report; never raises."""
import dataclasses
import json

from helpers.errors import RankFailed
from helpers.grading.registry import checks_for

# The executed notebook keeps this mimetype's JSON, so CI reads results, not printed text.
MIMETYPE = "application/vnd.dp-course.check+json"
_MARKS = {"passed": "PASS", "failed": "FAIL", "not implemented": "TODO"}


@dataclasses.dataclass
class CheckResult:
    """Outcome of one question's public checks."""

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


def _is_not_implemented(exc):
    if isinstance(exc, NotImplementedError):
        return True
    # Student code running on ranks reaches us as RankFailed carrying the rank's exception type.
    return isinstance(exc, RankFailed) and exc.exc_type == "NotImplementedError"


def run_one(fn, namespace):
    """(status, reason) of one check function."""
    try:
        fn(namespace)
    except Exception as exc:  # noqa: BLE001 - a check reports every failure, it never raises
        if _is_not_implemented(exc):
            return "not implemented", "not implemented yet"
        if isinstance(exc, AssertionError):
            return "failed", str(exc) or "assertion failed"
        return "failed", f"{type(exc).__name__}: {exc}"
    return "passed", ""


def check(question, namespace):
    """Run the public checks of `question` against the notebook's namespace, print one line each."""
    result = CheckResult(question)
    try:
        checks = checks_for(question)
    except ValueError as exc:
        print(f"check({question!r}): {exc}")
        return result
    for name, fn in checks:
        status, reason = run_one(fn, namespace)
        result.total += 1
        result.passed += status == "passed"
        result.not_implemented += status == "not implemented"
        line = f"[{_MARKS[status]}] {question} {name}" + (f": {reason}" if reason and status == "failed" else "")
        result.lines.append(line)
        print(line)
    todo = f", {result.not_implemented} not implemented yet" if result.not_implemented else ""
    print(f"{question}: {result.passed}/{result.total} public checks passed{todo}. "
          "Public checks only: the graded (hidden) tests are run separately.")
    return result
