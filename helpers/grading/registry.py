"""Where public checks live: the package helpers/grading/checks/labNN/ registers them per question "N.M"."""
import importlib

_CHECKS = {}  # question -> [(name, fn)], in definition order


def public_check(question, name=None):
    """Register fn(namespace) as a public check of `question`; it raises AssertionError to fail."""

    def register(fn):
        _CHECKS.setdefault(question, []).append((name or fn.__name__, fn))
        return fn

    return register


def checks_for(question):
    """The public checks of a question like "3.2", importing its lab's module on first use."""
    lab = question.split(".")[0]
    if not lab.isdigit():
        raise ValueError(f"question {question!r} should look like '3.2' (lab 3, question 2)")
    try:
        importlib.import_module(f"helpers.grading.checks.lab{int(lab):02d}")
    except ModuleNotFoundError as exc:
        raise ValueError(f"there are no checks for lab {int(lab):02d} (question {question!r})") from exc
    if question not in _CHECKS:
        raise ValueError(f"lab {int(lab):02d} has no question {question!r}; its questions: "
                         f"{sorted(q for q in _CHECKS if q.split('.')[0] == lab)}")
    return list(_CHECKS[question])


def questions_of(lab):
    """The questions of lab `lab` (a number) that have public checks, in order: ["3.1", "3.2", ...]."""
    importlib.import_module(f"helpers.grading.checks.lab{lab:02d}")
    return sorted((q for q in _CHECKS if q.split(".")[0] == str(lab)), key=lambda q: int(q.split(".")[1]))


def answer(namespace, name):
    """The student's definition `name`, or a failure that says which cell to run."""
    if name not in namespace:
        raise AssertionError(f"`{name}` is not defined: run the cell that defines it first")
    return namespace[name]
