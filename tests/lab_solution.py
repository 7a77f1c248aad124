"""For the tests of public checks: a lab's solution as a namespace, and what its failing checks said."""
import ast
import textwrap

import nbformat

from helpers.grading import check

# What definitions() keeps of a cell: no launches, no check() calls, no demonstrations.
DEFINITIONS = (ast.Import, ast.ImportFrom, ast.FunctionDef, ast.ClassDef)


def is_answer(cell):
    """A solution cell holding an answer."""
    return "### BEGIN SOLUTION" in cell.source


def namespace(path, select, override="", transform=lambda source, cell: source):
    """Run the code cells of the solution at `path` that select(cell) keeps, then `override`, in a fresh namespace.

    transform(source, cell) may cut a cell down (to source or an ast.Module) before it runs. The namespace's
    __name__ is not an importable module, so cloudpickle ships its functions to the ranks by value, as it does
    from a notebook. IPython magics (lines starting with %) are left out.
    """
    ns = {"__name__": f"lab{path.name[:2]}_solution"}
    for cell in nbformat.read(path, as_version=4).cells:
        if cell.cell_type == "code" and select(cell):
            source = "\n".join(line for line in cell.source.splitlines() if not line.startswith("%"))
            exec(compile(transform(source, cell), f"<solution cell {cell.id}>", "exec"), ns)
    exec(textwrap.dedent(override), ns)
    return ns


def keep_definitions(source, cell):
    """The parameters cell whole (sizes and seeds the answers read); of the others, imports, defs and classes."""
    if "parameters" in cell.metadata.get("tags", []):
        return source
    tree = ast.parse(source)
    tree.body = [node for node in tree.body if isinstance(node, DEFINITIONS)]
    return tree


def definitions(path, override=""):
    """The solution's parameters cell, then its top-level imports, functions and classes, then `override`.

    A wrong answer in `override` replaces one definition. Nothing launches, so this is cheap to build per test.
    """
    return namespace(path, lambda cell: True, override, transform=keep_definitions)


def assert_report_mentions(question, namespace, *fragments):
    """check(question) on namespace fails at least one check, and its report holds every fragment."""
    result = check(question, namespace)
    assert result.passed < result.total, f"{question}: a wrong answer passed: {result.lines}"
    text = "\n".join(result.lines)
    for fragment in fragments:
        assert fragment in text, f"{question}: expected {fragment!r} in the report:\n{text}"


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
