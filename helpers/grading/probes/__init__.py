"""Hidden tests ("probes") per lab: expressions evaluated in the student's kernel, judged in the grader.

A probe file `labNN.py` (here, or in an instructor's private directory given as PROBES=dir) defines
    SETUP = "code run in the student's kernel before the probes (define _probe_* helpers here)"
    PROBES = [Probe("3.1", "a name the student sees", "an expression", points=1), ...]

The contract, and why:
- Inputs are secret. The kernel gets `_PROBE_SEED`, the question's seed drawn from the grading run's secret
  seed (assemble.question_seed); expressions and SETUP draw sizes, data, world sizes and initialisations from
  it, so an output memorised for one call is worth nothing (tests/test_labs.py proves it for every probe).
- A probe returns raw data only: tensors, numbers, lists, the records of the collectives the ranks issued
  (helpers.comm.CommLedger), never a verdict computed in the student's kernel, which the student controls.
- The grader judges: `Probe.grade` runs in the grader's process, on the JSON the kernel sent (channel.py). By default
  the value must equal the solution's value for the same seed (plain.compare, rtol/atol); a `judge(expected,
  actual, seed) -> (passed, message)` replaces that where the lab leaves a choice free (10.1's sampling) or
  where structure is judged by a rule (bytes within 1 %, all-reduces started during backward); see judges.py.
- A failure teaches as the public check does: a probe whose value is what a public check's run returns (the check's
  rank function, run on the secret inputs) is judged with that check's own `diagnose` (judges.diagnosed), so the
  feedback names the same mistake, without a value of the right answer; a run that did not finish says the check's
  hint (`hint`).
- A shortcut scores 0: the library function a question rebuilds (`forbidden`), or code that hides what it
  runs, found in the answer's source (shortcuts.py).
A probe file declares `USES = {"3.4": ("3.1", "3.2", "3.3")}`: the earlier answers each question's probes call,
directly or through other answers. Those are graded with the solution's versions bound in place of the student's,
so one mistake costs one question; the student's own composition runs too and only informs the feedback
(helpers/grading/judge/reference.py, which also finds the USES the code shows; a file without USES binds nothing).
A probe file may also declare `MANUAL = [Manual("10.4", "the report's analysis", points=6, cell="report-analysis")]`:
parts graded by hand (a written report), whose text the grader copies out of each submission's Markdown cell of
that id for the instructor, and whose points the instructor enters in OUT/manual.csv (helpers/grading/report/manual.py).
Probe files are instructor code, run in the grader and in the graded kernel. In a public repository they are
not hidden: instructors who need hidden tests keep their own directory.
"""
import dataclasses
import importlib.util
import pathlib

DEFAULT_DIR = pathlib.Path(__file__).parent


@dataclasses.dataclass(frozen=True)
class Probe:
    """One hidden test: its question, a name shown to students, the expression, its points, how it is judged."""

    question: str
    name: str
    expr: str
    points: float = 1.0
    rtol: float = 1e-5
    atol: float = 1e-6
    # judge(expected, actual, seed) -> (passed, message), run in the grader's process on the raw values; seed is
    # the question's seed (the kernel's _PROBE_SEED). None: equal to the solution's value (plain.compare).
    judge: object = None
    # Names the answer must not use: the library function the question rebuilds (shortcuts.py).
    forbidden: tuple = ()
    # What a run of the ranks that did not finish (a hang, a dead rank) says first: the public check's hint for the
    # same run, e.g. "every rank must call dist.broadcast ...". The launcher's report itself is not repeated.
    hint: str = ""
    # ((text in the error, what it means), ...): an error the public check turns into a hint (torch's size error of an
    # unpadded shard: "the shard is not padded ..."); said as the check says it, instead of the error.
    errors: tuple = ()

    def grade(self, expected, actual, *, answer_source="", seed=0):
        """(passed, message): actual against the solution's value, in the grader's process.

        seed: the grading run's secret seed (this question's is derived from it, as the kernel's was)."""
        from helpers.grading.judge.plain import compare
        from helpers.grading.prepare.assemble import question_seed
        from helpers.grading.probes.shortcuts import refusal

        why = refusal(answer_source, self.forbidden)
        if why:
            return False, why
        try:
            if self.judge is None:
                return compare(expected, actual, self.rtol, self.atol)
            return self.judge(expected, actual, question_seed(seed, self.question))
        except Exception as exc:  # noqa: BLE001 - the value is the student's: anything may arrive
            return False, f"the value could not be judged ({type(exc).__name__}): see the lab for what to return"


@dataclasses.dataclass(frozen=True)
class Manual:
    """A part graded by hand: its question, a name students see, its points, the id of the Markdown cell it is in."""

    question: str
    name: str
    points: float
    cell: str


def _module(lab, directory):
    path = pathlib.Path(directory or DEFAULT_DIR) / f"lab{lab}.py"
    if not path.is_file():
        raise FileNotFoundError(f"no probes for lab {lab}: expected {path}")
    spec = importlib.util.spec_from_file_location(f"_probes_lab{lab}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module, path


def load_manual(lab, directory=None):
    """[Manual, ...] for lab "10" from directory: the parts graded by hand (none for most labs)."""
    return list(getattr(_module(lab, directory)[0], "MANUAL", []))


def load_uses(lab, directory=None):
    """{question: (earlier questions its probes call)} for lab "03" from directory ({} when the file declares none)."""
    return {q: tuple(used) for q, used in getattr(_module(lab, directory)[0], "USES", {}).items()}


def load(lab, directory=None):
    """(SETUP, [Probe, ...]) for lab "03" from directory (default: the course's own probes)."""
    module, path = _module(lab, directory)
    probes = list(module.PROBES)
    if not probes:
        raise ValueError(f"{path} defines no PROBES")
    return getattr(module, "SETUP", ""), probes
