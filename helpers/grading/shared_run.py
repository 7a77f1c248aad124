"""One multi-rank run shared by every public check of a question, so a question launches its ranks once; and the
one Gloo launcher of checks and probes, which starts no ranks for a run that can only reach the lab's TODOs."""
import builtins
import dis
import inspect
import re
import sys


def definitions(ns, *values):
    """The key of a shared run: every function and class in the student's namespace (and `values`).

    An answer may call any of them (a helper of the student's, the Reducer that lab 10's bring function returns), so
    a student who fixes any one and reruns the check cell gets a fresh run, not the stale result of the old code.
    """
    return tuple((name, value) for name, value in ns.items()
                 if inspect.isfunction(value) or inspect.isclass(value)) + values


def part_or_error(part, *args):
    """part(*args) on a rank, or {"error": ...} if the answer raised, so one shared run serves several checks and each
    check says what its own part needs. NotImplementedError passes through: check() reports it as "not implemented"."""
    try:
        return part(*args)
    except NotImplementedError:
        raise
    except Exception as exc:  # noqa: BLE001 - the answer may raise anything; the same on every rank
        return {"error": f"{type(exc).__name__}: {exc}"}


class RunFailed(AssertionError):
    """The ranks' run of a check did not complete (a hang, a deadlock, a dead rank): the launcher's report.

    check() prints it first and once, then names the checks that needed the run.
    """


class SharedRun:
    """shared(question, key, compute): compute() once per (question, key), its exception included.

    Only the latest key per question is kept: a student who edits an answer and reruns the check cell gets a new
    key (the checks build it from the answer's code), hence a fresh run. When the run failed, every check of the
    question raises the same exception object, which check() prints once.
    """

    def __init__(self):
        self._last = {}  # question -> (key, (ok, value or exception))

    def __call__(self, question, key, compute):
        if question not in self._last or self._last[question][0] != key:
            try:
                outcome = (True, compute())
            except Exception as exc:  # noqa: BLE001 - reported once for every check of the question
                outcome = (False, exc)
            self._last[question] = (key, outcome)
        ok, value = self._last[question][1]
        if not ok:
            raise value
        return value


def run_failed(exc, hint="", what=""):
    """RunFailed for a CollectiveHang or a dead rank: what was running, what to look at, the launcher's report.

    The hint (what the student most likely did, and the fix) comes first: it is the line a student reads.
    """
    what = f"{what}: " if what else ""
    failure = RunFailed(f"{what}the ranks did not finish together: {hint or 'see the report. '}"
                        f"Launcher's report: {exc}")
    failure.error = exc  # the CollectiveHang or RankFailed itself, for checks that diagnose from its reports
    return failure


# Checks and probes run on Gloo on every machine, a GPU box included: their reference values are computed on the
# CPU, their tensors are small (NCCL would add CUDA start-up to every check), and a verdict must not depend on
# the machine that grades. The GPU path of the same code is run by `make gpu-check` (helpers/gpu_check.py).
def launch_gloo(fn, world_size, *, args=(), hang_timeout=30.0, **kwargs):
    """helpers.launch on Gloo ranks: what every check and probe uses (see only_todos for the runs it skips)."""
    todo = only_todos(fn, args)
    if todo:
        raise todo
    from helpers.launch import launch

    return launch(fn, world_size, args=args, hang_timeout=hang_timeout, **{**kwargs, "backend": "gloo"})


# --- runs that can only reach the lab's TODOs ---------------------------------------------------------------------
# A student's notebook runs every check and probe, answered or not, and a launch costs ~0.2 CPU-s (2-4 processes
# forked and torn down) to end in NotImplementedError on every rank. When the only student code a run can reach is
# generated stubs, the ranks run instructor code and those stubs, exactly as in the released lab, where the verdict
# is "not implemented" (tests/test_labs.py asserts it for every check and probe): that verdict is given without
# ranks. Any other student code within reach (an answer written, a given class, a lambda, an instance) launches.

# The generated stub, as Python 3.11 compiles `raise NotImplementedError("lab N.M")` (labgen); a docstring and the
# TODO comment leave no instructions. Another interpreter's bytecode does not match: every run launches.
_STUB_OPS = ["RESUME", "LOAD_GLOBAL", "LOAD_CONST", "PRECALL", "CALL", "RAISE_VARARGS"]
_STUB_TEXT = re.compile(r"lab \d+\.\d+")
_PROBE_PREFIX = "_probe_"  # instructor helpers that probe SETUP code defines in the student's namespace
_BY_NAME = {"eval", "exec", "globals", "vars", "getattr", "__import__"}  # reach names no code object lists
_LIBRARIES = {"torch", "numpy", "helpers"}
_PLAIN = (type(None), bool, int, float, complex, str, bytes, range, slice, type(Ellipsis))
_TORCH_VALUES = {"Tensor", "Parameter", "dtype", "device", "Size", "layout", "memory_format", "finfo", "iinfo"}


def todo_stub(fn):
    """'lab N.M' if fn is a function whose whole body (docstring aside) is labgen's raise, else None.

    Only a plain function of the module's top level: a class, a method, a generator, or a body with anything
    else in it, may pass a check without reaching its raise."""
    flags = inspect.CO_GENERATOR | inspect.CO_COROUTINE | inspect.CO_ASYNC_GENERATOR
    if not inspect.isfunction(fn) or fn.__qualname__ != fn.__name__ or fn.__code__.co_flags & flags:
        return None
    ops = [(i.opname, i.argval) for i in dis.get_instructions(fn)]
    if [op for op, _ in ops] != _STUB_OPS or ops[1][1] != "NotImplementedError":
        return None
    # NotImplementedError must be the builtin one: the name is looked up in the function's globals first
    if "NotImplementedError" in fn.__globals__ or fn.__builtins__.get("NotImplementedError") \
            is not builtins.NotImplementedError:
        return None
    text = ops[2][1]
    return text if isinstance(text, str) and _STUB_TEXT.fullmatch(text) else None


def _student_code(value, found, seen):
    """Collect into found (stub text, or None for any other student code) what value can run of the notebook's.

    Only the course's own functions (helpers.*) count as instructor code and plain values (numbers, strings,
    tensors) as inert; anything else, a function or an object from anywhere else (a student's module, an nn.Module
    that may hold the student's layers) may run student code: None, and the run launches."""
    if id(value) in seen:
        return
    seen[id(value)] = value  # held, so that no later object (a temporary tuple) gets its id
    module = getattr(value, "__module__", None) or ""
    if isinstance(value, (tuple, list, set, frozenset)):
        for item in value:
            _student_code(item, found, seen)
    elif isinstance(value, dict):
        for item in value.values():
            _student_code(item, found, seen)
    elif inspect.isfunction(value) and module.startswith("helpers."):
        for cell in value.__closure__ or ():  # instructor code: what it was handed may be the student's
            _student_code(cell.cell_contents, found, seen)
        _student_code((value.__defaults__, value.__kwdefaults__), found, seen)
    elif inspect.isfunction(value) and module == "__main__" and value.__qualname__.startswith(_PROBE_PREFIX):
        _probe_helper(value, found, seen)
    elif inspect.isfunction(value) and module == "__main__":
        found.append(todo_stub(value))
    elif inspect.isclass(value) and module == "__main__" and value.__name__.startswith(_PROBE_PREFIX):
        for item in vars(value).values():  # a probe's own class (a model): what its methods read
            if isinstance(item, property):
                item = (item.fget, item.fset, item.fdel)
            _student_code(item.__func__ if isinstance(item, (staticmethod, classmethod)) else item, found, seen)
    elif not _inert(value):
        found.append(None)


def _inert(value):
    """A value that runs no code of anyone's: a number, a string, a builtin class or function, a tensor, a dtype."""
    if isinstance(value, _PLAIN) or inspect.isclass(value) and value.__module__ == "builtins":
        return True
    if inspect.isgetsetdescriptor(value) or inspect.ismemberdescriptor(value):  # a class's __dict__, __slots__
        return True
    if inspect.ismodule(value):  # what a probe helper reads: torch, math; a student's own module is not inert
        root = value.__name__.split(".")[0]
        return root in _LIBRARIES or root in sys.stdlib_module_names
    if inspect.isbuiltin(value):  # len, or a method bound to an object that may be the student's
        return value.__self__ is None or inspect.ismodule(value.__self__)
    kind = type(value)
    return kind.__module__.split(".")[0] == "torch" and kind.__name__ in _TORCH_VALUES


def _probe_helper(fn, found, seen):
    """A function of probe SETUP code (or a method of its class) in the notebook: the notebook names it reads."""
    names = _global_names(fn.__code__)
    if names & _BY_NAME:
        found.append(None)
    for name in names:
        if name in fn.__globals__:
            _student_code(fn.__globals__[name], found, seen)
    _student_code((fn.__closure__ and [c.cell_contents for c in fn.__closure__], fn.__defaults__,
                   fn.__kwdefaults__), found, seen)


def _global_names(code):
    """Every name a code object and the code nested in it may read from its globals (or as an attribute)."""
    names = set(code.co_names)
    for const in code.co_consts:
        if inspect.iscode(const):
            names |= _global_names(const)
    return names


def only_todos(fn, args):
    """A RankFailed like the launcher's when every rank would raise the lab's NotImplementedError, else None.

    That is when the student code that fn and args can reach is stubs only, and at least one (see todo_stub)."""
    found = []
    _student_code((fn, args), found, {})
    if not found or None in found:
        return None
    from helpers.errors import RankFailed

    return RankFailed(f"rank 0 raised NotImplementedError: {found[0]} (not launched: the only code of yours this run "
                      "can reach is the lab's TODO)", rank=0, exc_type="NotImplementedError")


def launch_on_gloo(fn, world_size, args, hang_timeout, hint="", what=""):
    """Run fn on Gloo ranks for a check; a hang or a dead rank becomes a RunFailed that says what to look at."""
    from helpers.errors import (  # here, so that importing this module stays light
        CollectiveHang,
        RankFailed,
    )
    try:
        return launch_gloo(fn, world_size, args=args, hang_timeout=hang_timeout)
    except (CollectiveHang, RankFailed) as exc:
        if isinstance(exc, RankFailed) and exc.exitcode is None:
            raise  # an exception in the student's code: its own message is the best report
        raise run_failed(exc, hint, what) from None
