"""Shortcuts an answer must not take, found in its source by the grader (never in the student's kernel).

Two kinds, each scoring 0 on the probes of the question with a message saying why:
    forbidden   per question (Probe.forbidden): the library function the question rebuilds, e.g. `all_reduce`
                in a ring, `DistributedSampler` in 3.1, `helpers.theory` in 6.1.
    HIDING      every question: what would hide from this reading what an answer runs (`exec`, `eval`,
                `__import__`, `importlib`, `sys.modules`, `getattr` by a computed name, ...), the kernel's shell
                and frames (`get_ipython`, `In`, `_getframe`, `inspect.stack`, `format_stack`, a function's
                `__code__`: they read and rewrite the probe cell, its SETUP and references), IPython syntax
                (a magic hides what it runs), and the grader's own machinery that runs in the kernel
                (`helpers.grading`, `probe_runtime`, `run_probes`, `_PROBE_SEED`, the probes' `_probe_*` helpers),
                and the routes to code in a file (`runpy`, `sys.path`, `pickle`, `marshal`, `pkgutil.resolve_name`).
    PATCHES     every question: an attribute of a library assigned or deleted (`json.dumps = f`, `setattr(dist,
                ...)`, `type(t).add_ = f`): the probes run after the answers, through the functions it replaced
                (patches_library; the probes' channel itself no kernel code can rewrite: run/channel.py).
    IMPORTS     every question: a module the grader's Python cannot find (a file the answer wrote at run time and
                imported: the scan cannot read it), and the grader's own package `helpers.grading` (its public
                checks wrap the library: lab 03's common module is DistributedSampler).
An answer the parser cannot hold (thousands of nested operators: MemoryError, RecursionError) scores 0 too, as
unreadable: what it runs cannot be read.
The source read is every answer cell that ran before the question's probe: a shortcut may hide in an earlier one.
A name counts as Python sees it: a name, an attribute, an imported name, or a string (`getattr(dist,
"all_reduce")`). A dotted name ("helpers.theory") counts as an import of that module, `from helpers import
theory`, the attribute chain `helpers.theory`, or that string. Comments and docstrings do not count.
"""
import ast
import functools
import importlib.machinery
import os
import re
import sys

# Builtins and modules that run or reach code chosen at run time; `compile` and `eval` count only as bare names
# (torch.compile and model.eval() are fine).
HIDING = ("exec", "eval", "compile", "__import__", "importlib", "import_module", "__builtins__", "builtins",
          "sys.modules", "globals", "vars", "helpers.grading", "probe_runtime", "run_probes", "_evaluate",
          "_PROBE_SEED", "_probe_*",
          # Code from a file or from bytes, found at run time: a module the answer wrote, a pickled reference to a
          # library function (its name in bytes), a function found by a string.
          "sys.path", "meta_path", "path_hooks", "runpy", "pickle", "_pickle", "marshal", "resolve_name",
          "getmembers", "getmembers_static",
          # Attributes by a name the source does not spell (`getattr(dist, "all_" + "reduce")` and reading a
          # `__dict__` are caught by by_computed_name).
          "__getattribute__", "attrgetter", "methodcaller",
          # The kernel's shell, which reads and rewrites later cells (the probe cell and its nonce): hooks, input
          # transformers, the history; `quit._ip` and `exit._ip` are the shell too.
          "get_ipython", "_ip", "InteractiveShell", "ipykernel", "input_transformers_post",
          "input_transformers_cleanup", "ast_transformers", "displayhook", "display_pub", "In", "_ih", "Out", "_oh",
          # Frames: the probe's own locals (its nonce) and its module's globals.
          # Not `gc`, `inspect` or `events`, which honest answers use (gc.collect() before a memory reading, a
          # profiler's prof.events()): the calls that reach frames and the shell through them are named instead.
          "_getframe", "currentframe", "f_back", "f_locals", "f_globals", "tb_frame", "settrace", "setprofile",
          "get_objects", "get_referrers", "get_referents",
          # The probe cell's text and its arguments (the SETUP, the solution's earlier answers: reference.py) through
          # the stack's summaries, a frame's code or arguments, a function's code object, the line cache, the history.
          "f_code", "gi_frame", "cr_frame", "ag_frame", "__code__", "co_consts", "co_code", "co_names",
          "getargvalues", "getouterframes", "getinnerframes", "inspect.stack", "inspect.trace", "extract_stack",
          "format_stack", "walk_stack", "print_stack", "linecache", "history_manager",
          # Replacing a library's functions for a while, or in memory: what patches_library reads, done by a call.
          "unittest.mock", "pytest", "_pytest", "ctypes")
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


# Magics whose body or argument is Python run as Python (the scan reads that), and one that runs none.
_CELL_MAGICS = ("%%ranks", "%%time", "%%timeit", "%%capture")
_LINE_MAGICS = re.compile(r"^(\s*)%(?:time|timeit(?:\s+-\w+(?:\s+\d+)?)*)\s+(.*)$")
_NO_CODE = re.compile(r"^(\s*)%matplotlib\b.*$")


def _python(source):
    """The source as Python: a first line `%%ranks ...` (or %%time, %%timeit, %%capture) dropped, since the rest
    runs as Python; `%time x` and `%timeit x` read as `x`; `%matplotlib inline` as `pass`. Other magics stay, and
    ipython_syntax() refuses them: what they run is hidden in a string. First what IPython does to every cell before
    anything else (its cleanup transforms): leading blank lines dropped, a cell indented as a whole dedented, `>>> `
    prompts stripped. The kernel runs such a cell, so the scan must read it: as plain Python an answer cell that
    began with a blank line was "IPython syntax" (0 points), and an indented one did not parse (read as nothing)."""
    from IPython.core.inputtransformer2 import TransformerManager

    cleaned = source.splitlines(keepends=True)
    for cleanup in TransformerManager().cleanup_transforms:
        cleaned = cleanup(cleaned)
    lines = "".join(cleaned).split("\n")
    if lines and lines[0].split(maxsplit=1)[:1] and lines[0].split(maxsplit=1)[0] in _CELL_MAGICS:
        lines = ["# a cell magic", *lines[1:]]  # a line still: the line numbers stay
    lines = [_NO_CODE.sub(r"\1pass", _LINE_MAGICS.sub(r"\1\2", line)) for line in lines]
    return "\n".join(lines)


def ipython_syntax(source):
    """The first line that IPython reads otherwise than Python does (a magic, `!cmd`, `obj?`), or None.

    The scan reads Python; such a line runs in the kernel but hides from it (`_ = %pwd` made a whole cell
    unreadable, so that nothing in it counted)."""
    from IPython.core.inputtransformer2 import TransformerManager

    python, manager = _python(source), TransformerManager()
    lines = (python if python.endswith("\n") else python + "\n").splitlines(keepends=True)
    for transform in manager.cleanup_transforms + manager.line_transforms:  # as transform_cell does
        lines = transform(lines)
    # One rewrite finds the first such line (IPython rewrites the earliest first). transform_cell rewrites them all,
    # tokenising the whole cell again for each, and raises past 500: 600 lines of `a?` took 7 CPU-s, then RuntimeError
    # ended the student's grading (grader_error on every re-grade; test_one_student).
    transformed = "".join(manager.do_one_token_transform(lines)[1])
    if transformed.rstrip() == python.rstrip():
        return None
    pairs = zip(python.splitlines(), transformed.splitlines())
    return next((mine for mine, theirs in pairs if mine != theirs), python.strip().splitlines()[0])


def as_scanned(cell_source):
    """One answer cell as the scan joins it to the others: its Python (a first-line cell magic dropped, which only
    a cell's first line can be); "" when the kernel runs none of it (a syntax error: IPython compiles a cell whole),
    which would otherwise make the joined cells unparsable and the scan read nothing after it; the cell whole when
    it holds IPython syntax (ipython_syntax refuses it) or when the parser gave up (unreadable scores it 0)."""
    python = _python(cell_source)
    try:
        ast.parse(python)
    except SyntaxError:
        return cell_source if ipython_syntax(cell_source) is not None else ""
    except (MemoryError, RecursionError, ValueError):
        return cell_source
    return python


@functools.lru_cache(maxsize=64)  # every probe of a question reads the same source
def _parsed(source):
    """(tree, "") of the source; (None, "") when it is not Python (the kernel fails that cell as well); (None,
    the error's name) when the parser itself gave up (MemoryError, RecursionError; ValueError: a null byte)."""
    try:
        return _strip_docstrings(ast.parse(_python(source))), ""
    except SyntaxError:
        return None, ""
    except (MemoryError, RecursionError, ValueError) as exc:
        return None, type(exc).__name__


def _tree(source):
    return _parsed(source)[0]


def unreadable(source):
    """Why the answer cells run before a probe cannot be read (0 points), or ""."""
    error = _parsed(source)[1] if source else ""
    if not error:
        return ""
    return (f"an answer cell run before this probe could not be read as Python ({error} in the parser: thousands "
            "of nested or chained operators?): 0 points (write plain code, a few operators per expression)")


# The modules a library function is fetched from (as the labs import them): a computed name on these hides a call.
_LIBRARY_ROOTS = {"dist", "torch", "nn", "F", "functional", "distributed", "c10d", "helpers", "sys", "os", "builtins"}


def _root(node):
    """The name an expression starts from (`dist` of `dist.group.WORLD`, `model` of `model[0].weight`), or None."""
    while isinstance(node, (ast.Attribute, ast.Subscript, ast.Call)):
        node = node.func if isinstance(node, ast.Call) else node.value
    return node.id if isinstance(node, ast.Name) else None


def _roots(nodes):
    """The library roots and the names the source binds to a module or to a library object: by an import (`import
    torch.nn.parallel as P`, `from torch.utils import data`) or by assigning an attribute chain of one (`m =
    torch.utils.data`). A name bound to the result of a call (`model = nn.Linear(2, 2)`) is the answer's own."""
    roots = set(_LIBRARY_ROOTS)
    assigned = []
    for node in nodes:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            roots.update((alias.asname or alias.name).split(".")[0] for alias in node.names)
        elif isinstance(node, ast.Assign) and isinstance(node.value, (ast.Name, ast.Attribute)):
            assigned.append(node)
    for _ in range(len(assigned)):  # `a = torch.nn; b = a.parallel`: until nothing changes
        new = {t.id for node in assigned if _dotted(node.value) and _dotted(node.value).split(".")[0] in roots
               for t in node.targets if isinstance(t, ast.Name)} - roots
        if not new:
            break
        roots |= new
    return roots


def by_computed_name(source):
    """`getattr(m, <not a string>)` or a read of `m.__dict__` (not `in`) where m is a library module (dist, torch,
    F, ...): a library function fetched by a name the source does not spell. Also `getattr` passed around bare.

    On the student's own objects both are honest idioms (chapter 08's `getattr(model[0], name)`), and so are
    setattr and delattr by computed names (lab 08 needs them)."""
    tree = _tree(source)
    nodes = list(ast.walk(tree)) if tree else []
    roots = _roots(nodes)
    called, in_tests = set(), set()
    for node in nodes:
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "getattr":
            called.add(id(node.func))
            spelled = len(node.args) >= 2 and isinstance(node.args[1], ast.Constant)
            if node.args and not spelled and _root(node.args[0]) in roots:
                return "getattr"
        if isinstance(node, ast.Compare) and all(isinstance(op, (ast.In, ast.NotIn)) for op in node.ops):
            in_tests.update(id(c) for c in node.comparators)  # `attr in obj.__dict__` reads no attribute
    for node in nodes:
        if isinstance(node, ast.Name) and node.id == "getattr" and id(node) not in called:
            return "getattr"
        if (isinstance(node, ast.Attribute) and node.attr == "__dict__" and id(node) not in in_tests
                and _root(node.value) in roots):
            return "__dict__"
    return None


# Store targets rooted here are a library's too: `type(t).add_ = f` and `object.__setattr__(torch, ...)`.
_TYPE_ROOTS = {"type", "object"}


def _patched(target, roots):
    """Whether an attribute store or delete on target (the object left of the attribute) may change a library: its
    root is a library module or object, or a type (`type(t)`, `x.__class__`), or cannot be named
    (`(lambda: json)().dumps`)."""
    root = _root(target)
    chain = target
    while isinstance(chain, (ast.Attribute, ast.Subscript, ast.Call)):
        if isinstance(chain, ast.Attribute) and chain.attr.startswith("__"):
            return True
        chain = chain.func if isinstance(chain, ast.Call) else chain.value
    return root is None or root in roots


def patches_library(source):
    """The first attribute of a library that the source assigns or deletes (`json.dumps = f`, `del torch.equal`,
    `setattr(dist, "all_reduce", f)`, `type(t).add_ = f`), as written, or None.

    The probes run in the kernel after the answers: a library function an answer replaced runs in them (IPython's
    display publisher rewrote a probe's values; torch.allclose = lambda: True). On the student's own objects
    (`self.buckets = []`, `model.weight = p`, `setattr(model, name, p)`) stores are honest and allowed."""
    tree = _tree(source)
    nodes = list(ast.walk(tree)) if tree else []
    roots = _roots(nodes) | _TYPE_ROOTS
    for node in nodes:
        if isinstance(node, ast.Attribute) and isinstance(node.ctx, (ast.Store, ast.Del)) and _patched(node.value,
                                                                                                         roots):
            return ast.unparse(node)
        call = isinstance(node, ast.Call) and node.args
        name = call and (node.func.id if isinstance(node.func, ast.Name) else
                         node.func.attr if isinstance(node.func, ast.Attribute) else None)
        if name in ("__setattr__", "__delattr__") and _root(node.func.value) not in roots:
            target = node.func.value  # bound: `super().__setattr__(name, value)`, `json.__setattr__(...)`
        elif name in ("setattr", "delattr", "__setattr__", "__delattr__"):
            target = node.args[0]  # `setattr(dist, ...)`, `object.__setattr__(torch, ...)`
        else:
            continue
        if _patched(target, roots):
            return ast.unparse(node.func) + f"({ast.unparse(node.args[0])}, ...)"
    return None


def _find_spec(name, path):
    """The grader's spec of a module, searched without the current directory; None if there is none."""
    if path is not None:
        return importlib.machinery.PathFinder.find_spec(name, path)
    if name in sys.builtin_module_names:
        return importlib.machinery.ModuleSpec(name, None, origin="built-in")
    clean = [p for p in sys.path if p and os.path.abspath(p) != os.getcwd()]
    for finder in sys.meta_path:
        if finder is importlib.machinery.PathFinder:
            spec = importlib.machinery.PathFinder.find_spec(name, clean)
        elif hasattr(finder, "find_spec"):
            spec = finder.find_spec(name, None)
        else:
            continue
        if spec is not None:
            return spec
    return None


@functools.lru_cache(maxsize=1024)
def installed(module):
    """Whether the grader's Python finds module (dotted), nothing imported: down to a regular module or package
    (what lies under one is read-only to the kernel), through namespace packages (a kernel could add a portion)."""
    path, parts = None, module.split(".")
    for i in range(len(parts)):
        spec = _find_spec(".".join(parts[:i + 1]), path)
        if spec is None:
            return False
        if spec.origin not in (None, "namespace") or not spec.submodule_search_locations:
            return True
        path = list(spec.submodule_search_locations)
    return True


def unknown_import(source):
    """The first module the source imports that the grader's Python cannot find, or None."""
    tree = _tree(source)
    for node in ast.walk(tree) if tree else ():
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
            [node.module] if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module else [])
        unknown = next((name for name in names if not installed(name)), None)
        if unknown:
            return unknown
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
    why = unreadable(source)
    if why:
        return why
    used = shortcut(source, forbidden)
    if used:
        return f"uses `{used}`, which this question asks you to build yourself: 0 points"
    used = shortcut(source, HIDING)
    if used:
        return (f"uses `{used}`, which hides what the answer runs or reaches into the grader: 0 points "
                "(call the functions you need directly)")
    patched = patches_library(source) if source else None
    if patched:
        return (f"assigns `{patched}`, an attribute of a library the probes run after your answers: 0 points (change "
                "your own objects, never a library's)")
    module = unknown_import(source) if source else None
    if module:
        return (f"imports `{module}`, which is not a module of the course or of its Python: 0 points (a module "
                "written at run time hides what the answer runs; write the code in the answer cell)")
    used = by_computed_name(source)
    if used:
        return (f"uses `{used}` to reach an attribute by a name computed at run time, which hides what the answer "
                "calls: 0 points (write the attribute's name: `obj.name`)")
    line = ipython_syntax(source) if source else None
    if line is not None:
        return (f"uses IPython syntax in `{line.strip()[:60]}`, which the grader does not read as Python: 0 points "
                "(answers are plain Python; the magics allowed are %%ranks, %%time, %%timeit and %%capture as a "
                "first line, and %time, %timeit and %matplotlib)")
    return ""
