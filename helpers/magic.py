"""`%%ranks N`: run a notebook cell on N ranks through `helpers.launch`.

The cell's code travels as source; the notebook variables it names travel by value (cloudpickle).
Each rank runs it in a fresh namespace, so assignments on a rank do not come back unless
`--collect NAME` asks for them (a list indexed by rank, stored in the notebook under NAME).
"""
import argparse
import ast
import linecache
import shlex
import types

import cloudpickle

from helpers.launch import launch, warm_up

_cells = 0


def parse_line(line):
    """Parse `%%ranks 4 --backend gloo --hang-timeout 30 --collect a,b`."""
    parser = argparse.ArgumentParser(prog="%%ranks", add_help=False, exit_on_error=False)
    parser.add_argument("world_size", type=int)
    parser.add_argument("--backend", default="auto", choices=["auto", "gloo", "nccl"])
    parser.add_argument("--hang-timeout", type=float, default=30.0)
    parser.add_argument("--collect", default="", help="comma-separated names to bring back per rank")
    try:
        options, extra = parser.parse_known_args(shlex.split(line))
    except (argparse.ArgumentError, SystemExit) as exc:
        raise ValueError(f"%%ranks {line}: {exc}. Usage: %%ranks 4 [--backend auto|gloo|nccl] "
                         "[--hang-timeout SECONDS] [--collect name1,name2]") from None
    if extra:
        raise ValueError(f"%%ranks: unknown option(s) {extra}; see `%%ranks?` for the usage")
    options.collect = [n.strip() for n in options.collect.split(",") if n.strip()]
    return options


def register_source(source):
    """Give the cell a file name the kernel's line cache knows, so tracebacks show its lines."""
    global _cells
    _cells += 1
    filename = f"<ranks cell {_cells}>"
    lines = source.splitlines(keepends=True)
    linecache.cache[filename] = (len(source), None, lines, filename)
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


def ranks(line, cell, user_ns):
    """The body of the %%ranks magic, separate from IPython for testing."""
    options = parse_line(line)
    filename = register_source(cell)
    code = compile(cell, filename, "exec")  # a syntax error shows here, once, not on every rank
    shipped, unsendable = shippable_globals(code, user_ns)
    results = launch(run_cell, options.world_size, args=(cell, filename, shipped, unsendable, options.collect),
                     backend=options.backend, hang_timeout=options.hang_timeout)
    for name in options.collect:
        user_ns[name] = [r[name] for r in results]


def register(ipython):
    """Register %%ranks with IPython and start the forkserver in the background of the kernel."""

    def ranks_magic(line, cell):
        """%%ranks N [--backend auto|gloo|nccl] [--hang-timeout S] [--collect a,b]: run the cell on N ranks."""
        ranks(line, cell, ipython.user_ns)

    ipython.register_magic_function(ranks_magic, magic_kind="cell", magic_name="ranks")
    warm_up()
