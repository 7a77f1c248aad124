"""Hidden tests ("probes") per lab: expressions evaluated in the student's kernel on instructor inputs.

A probe file `labNN.py` (here, or in an instructor's private directory given as PROBES=dir) defines
    SETUP = "code run in the student's kernel before the probes (define _probe_* helpers here)"
    PROBES = [Probe("3.1", "a name the student sees", "an expression", points=1), ...]
Probe files are instructor code, run in the grader and in the graded kernel. In a public repository
they are not hidden: instructors who need hidden tests keep their own directory.
"""
import dataclasses
import importlib.util
import pathlib

DEFAULT_DIR = pathlib.Path(__file__).parent


@dataclasses.dataclass(frozen=True)
class Probe:
    """One hidden test: its question, a name shown to students, the expression, its points."""

    question: str
    name: str
    expr: str
    points: float = 1.0
    rtol: float = 1e-5
    atol: float = 1e-6
    # judge(expected, actual, question_seed) -> (passed, message), run in the grader's process on the raw values
    # (never a property computed in the student's kernel); default: equal to the solution's value.
    judge: object = None
    # Names the answer must not use: the library function the question rebuilds (found by shortcuts.py).
    forbidden: tuple = ()

    def grade(self, expected, actual, *, answer_source="", seed=0):
        """(passed, message): actual against the solution's value, in the grader's process."""
        from helpers.grading.assemble import question_seed
        from helpers.grading.plain import compare
        from helpers.grading.shortcuts import shortcut

        used = shortcut(answer_source, self.forbidden)
        if used:
            return False, f"uses `{used}`, which this question asks you to build yourself: 0 points"
        if self.judge is not None:
            try:
                return self.judge(expected, actual, question_seed(seed, self.question))
            except Exception as exc:  # noqa: BLE001 - the value is the student's: anything may arrive
                return False, f"the value could not be judged ({type(exc).__name__}); see the lab for what to return"
        return compare(expected, actual, self.rtol, self.atol)


def load(lab, directory=None):
    """(SETUP, [Probe, ...]) for lab "03" from directory (default: the course's own probes)."""
    path = pathlib.Path(directory or DEFAULT_DIR) / f"lab{lab}.py"
    if not path.is_file():
        raise FileNotFoundError(f"no probes for lab {lab}: expected {path}")
    spec = importlib.util.spec_from_file_location(f"_probes_lab{lab}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    probes = list(module.PROBES)
    if not probes:
        raise ValueError(f"{path} defines no PROBES")
    return getattr(module, "SETUP", ""), probes
