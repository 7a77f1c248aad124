"""Names an answer uses but the student defined outside the answer cells.

Only answer cells are taken from a submission; every other cell comes from the released lab. A helper the
student wrote in a cell of their own works in their notebook, passes the public checks, and is undefined
when graded. This finds such names so that the feedback can say so, per question.
"""
import ast
import builtins

from helpers.grading.prepare.assemble import answer_questions, find_answer


def _parse(source):
    # IPython magics (%%ranks, %load_ext) are not Python: drop those lines rather than give up on the cell.
    lines = [line for line in source.splitlines() if not line.lstrip().startswith(("%", "!"))]
    try:
        return ast.parse("\n".join(lines))
    except (SyntaxError, ValueError, MemoryError, RecursionError):  # thousands of nested operators: the parser gives
        return None  # up; the probes score that answer 0 as unreadable (shortcuts.unreadable)


def _top_level(tree):
    """Nodes of the module outside function and class bodies (their locals are not the cell's names)."""
    todo = list(tree.body)
    while todo:
        node = todo.pop()
        yield node
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            todo.extend(ast.iter_child_nodes(node))


def defined(source):
    """Names a cell binds at top level: def, class, import, assignment and loop targets."""
    tree = _parse(source)
    if tree is None:
        return set()
    names = set()
    for node in _top_level(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
    return names


def used(source):
    """Names a cell reads."""
    tree = _parse(source)
    if tree is None:
        return set()
    return {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}


def outside_names(released, submission):
    """{question: sorted names its answer uses that only the student's other cells define}."""
    answers, answer_cells = {}, set()
    for cell in released.cells:
        source = find_answer(cell, submission) if answer_questions(cell) else None
        if source is not None:
            answer_cells.add(source)
            for question in answer_questions(cell):
                answers[question] = answers.get(question, "") + source + "\n"
    graded = set(dir(builtins))
    for source in [c.source for c in released.cells if c.cell_type == "code" and not answer_questions(c)]:
        graded |= defined(source)
    for source in answer_cells:
        graded |= defined(source)
    theirs = set()
    for cell in submission.cells:
        if cell.cell_type == "code" and cell.source not in answer_cells:
            theirs |= defined(cell.source)
    found = {q: sorted(used(source) & (theirs - graded)) for q, source in answers.items()}
    return {q: names for q, names in found.items() if names}
