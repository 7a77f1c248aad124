"""Shortcuts a question forbids: the library function it asks the student to build, found in the answer's source.

Read by the grader from the answer cell's text, never from the student's kernel. Names are found as Python
sees them (names, attributes, imported names) and as strings (`getattr(dist, "all_reduce")`); comments and
docstrings do not count.
"""
import ast


def _names(tree):
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            yield node.id
        elif isinstance(node, ast.Attribute):
            yield node.attr
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                yield from alias.name.split(".")
            yield from (node.module or "").split(".") if isinstance(node, ast.ImportFrom) else ()
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.isidentifier():
            yield node.value


def _code(source):
    # IPython magics are not Python; a docstring is a string but not a use.
    lines = [line for line in source.splitlines() if not line.lstrip().startswith(("%", "!"))]
    try:
        tree = ast.parse("\n".join(lines))
    except SyntaxError:
        return None
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr) and isinstance(
                getattr(body[0], "value", None), ast.Constant) and isinstance(body[0].value.value, str):
            body[0] = ast.Pass()
    return tree


def shortcut(source, forbidden):
    """The first forbidden name the source uses, or None. A dotted name ("helpers.theory") is its last part."""
    if not forbidden or not source:
        return None
    tree = _code(source)
    if tree is None:
        return None
    used = set(_names(tree))
    return next((name for name in forbidden if name.split(".")[-1] in used), None)
