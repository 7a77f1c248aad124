"""For the tests of public checks: a lab's solution as a namespace, and what its failing checks said."""
import textwrap

import nbformat


def is_answer(cell):
    """A solution cell holding an answer."""
    return "### BEGIN SOLUTION" in cell.source


def namespace(path, select, override=""):
    """Run the code cells of the solution at `path` that select(cell) keeps, then `override`, in a fresh namespace.

    The namespace's __name__ is not an importable module, so cloudpickle ships its functions to the ranks by
    value, as it does from a notebook. IPython magics (lines starting with %) are left out.
    """
    ns = {"__name__": f"lab{path.name[:2]}_solution"}
    for cell in nbformat.read(path, as_version=4).cells:
        if cell.cell_type == "code" and select(cell):
            source = "\n".join(line for line in cell.source.splitlines() if not line.startswith("%"))
            exec(compile(source, f"<solution cell {cell.id}>", "exec"), ns)
    exec(textwrap.dedent(override), ns)
    return ns


def failed(result):
    """{check name: reason} of the checks that failed."""
    out = {}
    for line in result.lines:
        if line.startswith("[FAIL]"):
            name, _, reason = line.split(" ", 2)[2].partition(": ")
            out[name] = reason
    return out


def assert_fails(result, expected):
    """Every check named in expected failed, with its message fragment in the reason."""
    fails = failed(result)
    assert set(expected) <= set(fails), (fails, result.lines)
    for name, message in expected.items():
        assert message in fails[name], fails[name]
