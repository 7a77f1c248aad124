"""`%%ranks N`: run a notebook cell on N ranks through `helpers.launch`.

The cell's code travels as source; the notebook variables it names travel by value (cloudpickle).
Each rank runs it in a fresh namespace, so assignments on a rank do not come back unless
`--collect NAME` asks for them (a list indexed by rank, stored in the notebook under NAME).
Reports count lines as the cell shows them, the `%%ranks` line included, and name the cell `In [n]`.
A launch that fails shows its report alone, without the launcher's frames; `%tb` shows them.
"""
import argparse
import ast
import linecache
import os
import shlex
import sys
import types

import cloudpickle

from helpers.errors import LaunchError
from helpers.launch import launch, warm_up
from helpers.launcher import PACKAGE_DIR
from helpers.launcher.hang import name_cell
from helpers.launcher.traceback_text import wrap_report

_cells = 0


def parse_line(line):
    """Parse `%%ranks 4 --backend gloo --hang-timeout 30 --collect a,b --check-collectives`."""
    parser = argparse.ArgumentParser(prog="%%ranks", add_help=False, exit_on_error=False)
    parser.add_argument("world_size", type=int)
    parser.add_argument("--backend", default="auto", choices=["auto", "gloo", "nccl"])
    parser.add_argument("--hang-timeout", type=float, default=30.0)
    parser.add_argument("--collect", default="", help="comma-separated names to bring back per rank")
    parser.add_argument("--check-collectives", action="store_true", help="compare every collective across ranks")
    try:
        options, extra = parser.parse_known_args(shlex.split(line))
    except (argparse.ArgumentError, SystemExit) as exc:
        raise ValueError(f"%%ranks {line}: {exc}. Usage: %%ranks 4 [--backend auto|gloo|nccl] "
                         "[--hang-timeout SECONDS] [--collect name1,name2] [--check-collectives]") from None
    if extra:
        raise ValueError(f"%%ranks: unknown option(s) {extra}; see `%%ranks?` for the usage")
    options.collect = [n.strip() for n in options.collect.split(",") if n.strip()]
    return options


def register_source(line, source, label=None):
    """Give the cell a file name the kernel's line cache knows, so tracebacks show its lines.

    The cache holds the cell as the notebook shows it, `%%ranks` line first; label ('In [7]') names it in reports.
    """
    global _cells
    _cells += 1
    filename = f"<ranks cell {_cells}>"
    lines = [f"%%ranks {line}\n"] + source.splitlines(keepends=True)
    linecache.cache[filename] = (sum(map(len, lines)), None, lines, filename)
    if label:
        name_cell(filename, label)
    return filename


def referenced_names(code):
    """Every global name the compiled cell (and the functions it defines) may read."""
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= referenced_names(const)
    return names


def shippable_globals(code, user_ns):
    """The notebook variables the cell names, by value; the rest are listed as unsendable."""
    shipped, unsendable = {}, {}
    for name in sorted(referenced_names(code)):
        if name.startswith("_") or name in ("In", "Out", "get_ipython", "exit", "quit") or name not in user_ns:
            continue
        try:
            shipped[name] = cloudpickle.dumps(user_ns[name])
        except Exception as exc:  # noqa: BLE001 - report any pickling failure by name
            unsendable[name] = f"{type(exc).__name__}: {exc}"
    return shipped, unsendable


def run_cell(source, filename, shipped, unsendable, collect):
    """Runs on each rank: execute the cell, echo its last expression, return the collected names."""
    namespace = {"__name__": "__main__"}
    namespace.update({name: cloudpickle.loads(blob) for name, blob in shipped.items()})
    tree = ast.parse(source, filename)
    last = tree.body.pop() if tree.body and isinstance(tree.body[-1], ast.Expr) else None
    try:
        exec(compile(tree, filename, "exec"), namespace)
        if last is not None:
            value = eval(compile(ast.Expression(last.value), filename, "eval"), namespace)
            if value is not None:
                print(repr(value))
    except NameError as exc:
        if exc.name in unsendable:
            raise NameError(f"{exc}: the notebook's `{exc.name}` could not be sent to the ranks "
                            f"({unsendable[exc.name]}); create it inside this cell") from None
        raise
    missing = [n for n in collect if n not in namespace]
    if missing:
        raise NameError(f"--collect {','.join(missing)}: the cell never assigned {missing}")
    return {name: namespace[name] for name in collect}


def ranks(line, cell, user_ns, label=None):
    """The body of the %%ranks magic, separate from IPython for testing; label names the cell ('In [7]')."""
    options = parse_line(line)
    filename = register_source(line, cell, label)
    cell = "\n" + cell  # the %%ranks line is line 1: the code starts on line 2, as on screen
    code = compile(cell, filename, "exec")  # a syntax error shows here, once, not on every rank
    shipped, unsendable = shippable_globals(code, user_ns)
    results = launch(run_cell, options.world_size, args=(cell, filename, shipped, unsendable, options.collect),
                     backend=options.backend, hang_timeout=options.hang_timeout,
                     check_collectives=options.check_collectives)
    for name in options.collect:
        user_ns[name] = [r[name] for r in results]




def _in_launch(tb):
    """Whether a traceback passes through the launcher (an interrupt that stopped ranks, not other code)."""
    while tb is not None:
        if os.path.abspath(tb.tb_frame.f_code.co_filename).startswith(PACKAGE_DIR + os.sep):
            return True
        tb = tb.tb_next
    return False


def report_lines(etype, value):
    """What a failed launch shows in the cell: the report, wrapped on words, and how to see the rest."""
    if issubclass(etype, KeyboardInterrupt):
        text = "KeyboardInterrupt: interrupted while the ranks were running; every rank was stopped."
    else:
        text = f"{etype.__name__}: {value}"
    return (wrap_report(text) + "\n(%tb shows the full traceback, the launcher's frames included)").splitlines()


def show_launch_error(shell, etype, value, tb, tb_offset=None):
    """IPython's handler for launch errors: the report without the helpers' frames, as IPython hides its own."""
    if not (issubclass(etype, LaunchError) or _in_launch(tb)):
        shell.showtraceback((etype, value, tb), tb_offset=tb_offset, running_compiled_code=True)
        return None
    sys.last_type, sys.last_value, sys.last_traceback = etype, value, tb  # what %tb prints
    if sys.version_info >= (3, 12):
        sys.last_exc = value
    shell._showtraceback(etype, value, report_lines(etype, value))
    return None


def register(ipython):
    """Register %%ranks with IPython and start the forkserver in the background of the kernel."""

    def ranks_magic(line, cell):
        """%%ranks N [--backend auto|gloo|nccl] [--hang-timeout S] [--collect a,b] [--check-collectives]: run the
        cell on N ranks; --check-collectives compares every collective across ranks before it runs."""
        # IPython counts the cell before running it: the cell on screen is In [execution_count - 1].
        ranks(line, cell, ipython.user_ns, label=f"In [{ipython.execution_count - 1}]")

    ipython.register_magic_function(ranks_magic, magic_kind="cell", magic_name="ranks")
    # One handler per shell: leave another extension's alone rather than replace it.
    if ipython.custom_exceptions in ((), (LaunchError, KeyboardInterrupt)):
        ipython.set_custom_exc((LaunchError, KeyboardInterrupt), show_launch_error)
    warm_up()
