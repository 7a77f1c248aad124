"""Shortcuts an answer must not take, found in its source by the grader (never in the student's kernel).

Two kinds, each scoring 0 on the probes of the question with a message saying why:
    forbidden   per question (Probe.forbidden): the library function the question rebuilds, e.g. `all_reduce`
                in a ring, `DistributedSampler` in 3.1, `helpers.theory` in 6.1.
    HIDING      every question: what would hide from this reading what an answer runs (`exec`, `eval`,
                `__import__`, `importlib`, `sys.modules`, ...), and the grader's own machinery that runs in the
                kernel (`probe_runtime`, `run_probes`, `_PROBE_SEED`, the probes' `_probe_*` helpers).
A name counts as Python sees it: a name, an attribute, an imported name, or a string (`getattr(dist,
"all_reduce")`). A dotted name ("helpers.theory") counts as an import of that module, `from helpers import
theory`, the attribute chain `helpers.theory`, or that string. Comments and docstrings do not count.
"""
import ast

# Builtins and modules that run or reach code chosen at run time; `compile` and `eval` count only as bare names
# (torch.compile and model.eval() are fine).
HIDING = ("exec", "eval", "compile", "__import__", "importlib", "import_module", "__builtins__", "builtins",
          "sys.modules", "globals", "vars", "probe_runtime", "run_probes", "_evaluate", "_PROBE_SEED", "_probe_*")
_BARE_ONLY = {"exec", "eval", "compile", "globals", "vars"}


def _dotted(node):
    """'a.b.c' for an attribute chain of names, else None."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        return ".".join([node.id, *reversed(parts)])
    return None


def _uses(tree):
    """(bare names, attribute names, dotted names and modules) the tree uses."""
    bare, attrs, dotted = set(), set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            bare.add(node.id)
        elif isinstance(node, ast.Attribute):
            attrs.add(node.attr)
            dotted.add(_dotted(node))
        elif isinstance(node, ast.Import):
            for alias in node.names:
                parts = alias.name.split(".")
                attrs.update(parts)
                dotted.update(".".join(parts[:i]) for i in range(1, len(parts) + 1))
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            attrs.update(module.split("."))
            for alias in node.names:
                attrs.add(alias.name)
                bare.add(alias.asname or alias.name)
                dotted.update((module, f"{module}.{alias.name}"))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            if node.value.isidentifier():
                attrs.add(node.value)
            dotted.add(node.value)
    return bare, attrs, dotted - {None}


def _strip_docstrings(tree):
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if (isinstance(body, list) and body and isinstance(body[0], ast.Expr)
                and isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str)):
            body[0] = ast.Pass()
    return tree


def _tree(source):
    # IPython magics and shell lines are not Python; the kernel runs them, and no answer needs them.
    lines = [line for line in source.splitlines() if not line.lstrip().startswith(("%", "!"))]
    try:
        return _strip_docstrings(ast.parse("\n".join(lines)))
    except SyntaxError:
        return None


def _found(name, bare, attrs, dotted):
    if name.endswith("*"):
        return any(n.startswith(name[:-1]) for n in bare | attrs)
    if "." in name:
        return name in dotted or any(d.startswith(name + ".") for d in dotted)
    if name in _BARE_ONLY:
        return name in bare
    return name in bare or name in attrs


def shortcut(source, forbidden):
    """The first of the `forbidden` names the source uses, or None (also None when it is not Python)."""
    if not forbidden or not source:
        return None
    tree = _tree(source)
    if tree is None:
        return None
    uses = _uses(tree)
    return next((name for name in forbidden if _found(name, *uses)), None)


def refusal(source, forbidden):
    """Why the answer scores 0 on this question's probes, or "" when it takes no shortcut."""
    used = shortcut(source, forbidden)
    if used:
        return f"uses `{used}`, which this question asks you to build yourself: 0 points"
    used = shortcut(source, HIDING)
    if used:
        return (f"uses `{used}`, which hides what the answer runs or reaches into the grader: 0 points "
                "(call the functions you need directly)")
    return ""
