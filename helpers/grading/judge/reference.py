"""One mistake, one question: the released solution's versions of earlier answers, bound in place of the student's
while a later question's probes run.

A probe file declares, per question, the earlier answers its probes call, directly or through other answers:
    USES = {"3.4": ("3.1", "3.2", "3.3")}      # train_manual_ddp calls shard_indices, broadcast_parameters, ...
For such a question the probe cell receives a reference (`for_question`), a dict of
    source    the solution's code the references need, compiled in the kernel into a namespace of their own: of the
              lab's code cells before the question's answer, the parameters cell whole, the other cells' imports,
              functions, classes and literal constants (without comments), and of the answer cells only those of
              the questions used (never the question's own, never a later one's)
    globals   the names the used answers define, bound to the reference while the probes run
    classes   {class: {"base": "ref" or "student", "other": [method, ...]}} for a class built over several answers
              (lab 08's add_to_class): the probes see a subclass of `base` whose `other` methods come from the other
              side, so a question's own methods stay the student's while those of the questions it uses are the
              reference's
    define    the names among them the question's answer cells need to be defined at all (a decorator's class): where
              the student's is missing, the grader defines the solution's before those cells run (fill_missing)
The kernel (probe_runtime.run_probes) evaluates the probes with the references bound, which is what is scored, then
once more with the student's own functions, which only informs the feedback ("3.4 passes with the reference
`average_gradients`; with yours it fails (see 3.3)"). A question without USES runs once, as it always did.

computed_uses() reads which earlier answers a question's probes reach in the solution (its probe expressions, the
SETUP functions they call, the answers and given code those call, transitively): tests/grading/test_dependencies.py
asserts it equals every probe file's USES, and `python -m helpers.grading.judge.reference 03` prints it for a private
one.
The reference's source never goes back to a student: it is in the probe cell only (OUT/executed/ is instructor-only),
the probe runtime drops that cell's text from the kernel's line cache before any answer runs, and a quoted message
holding a line of it is not shown (leaked_lines).
"""
import ast
import pathlib
import sys

import nbformat

from helpers.grading.prepare.labgen import student_source

_KEEP = (ast.Import, ast.ImportFrom, ast.FunctionDef, ast.ClassDef)


def _python(source):
    """A solution cell as Python: IPython's magic lines (%matplotlib inline) dropped."""
    return "\n".join(line for line in source.splitlines() if not line.lstrip().startswith(("%", "!")))


def _questions(cell):
    """The questions whose solution regions a code cell holds (in order, once each)."""
    return list(dict.fromkeys(student_source(cell.source)[1])) if cell.cell_type == "code" else []


def _decorated_class(node):
    """X of a function decorated `@add_to_class(X)` (a method added to a class defined in another cell), or None."""
    for decorator in getattr(node, "decorator_list", []):
        if (isinstance(decorator, ast.Call) and isinstance(decorator.func, ast.Name)
                and decorator.func.id == "add_to_class" and decorator.args and isinstance(decorator.args[0], ast.Name)):
            return decorator.args[0].id
    return None


def _definitions(cell):
    """[(name, class or None, node)] of a cell's top-level functions and classes; class: the add_to_class target."""
    try:
        tree = ast.parse(_python(cell.source))
    except SyntaxError:
        return []
    return [(node.name, _decorated_class(node), node) for node in tree.body
            if isinstance(node, (ast.FunctionDef, ast.ClassDef))]


def components(solution):
    """{question: {"globals": [names], "classes": [names], "methods": [(class, method)]}}: what each question's
    answer cells define (methods: functions an answer adds to a class with add_to_class)."""
    out = {}
    for cell in solution.cells:
        for question in _questions(cell):
            mine = out.setdefault(question, {"globals": [], "classes": [], "methods": []})
            for name, cls, node in _definitions(cell):
                mine["globals"].append(name)
                if isinstance(node, ast.ClassDef):
                    mine["classes"].append(name)
                if cls:
                    mine["methods"].append((cls, name))
    return out


def order(solution):
    """The lab's questions in the order their answers appear."""
    return list(dict.fromkeys(q for cell in solution.cells for q in _questions(cell)))


def _literal(node):
    """An assignment of a literal (`FP32_ADAM = {"k": 8, ...}`): a given constant an answer may read."""
    if not isinstance(node, ast.Assign):
        return False
    try:
        ast.literal_eval(node.value)
    except ValueError:
        return False
    return True


def kept(cell):
    """The part of a cell the references need: the parameters cell whole, else imports, functions, classes and
    assignments of literals (nothing that runs: no launch, no print), without comments."""
    source = _python(cell.source)
    if "parameters" in cell.get("metadata", {}).get("tags", []):
        return source
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return ""
    return "\n\n".join(ast.unparse(node) for node in tree.body if isinstance(node, _KEEP) or _literal(node))


def for_question(solution, question, uses):
    """The reference the probe cell of `question` binds (see the module docstring), or None when it uses no answer."""
    uses = tuple(uses)
    if not uses:
        return None
    parts = components(solution)
    unknown = [q for q in uses if q not in parts]
    if unknown:
        raise ValueError(f"USES of {question} names {unknown}, which no answer cell of the solution answers: "
                         f"the questions are {', '.join(parts)}")
    source = []
    for cell in solution.cells:
        questions = _questions(cell)
        if question in questions:
            break
        if cell.cell_type != "code" or (questions and not set(questions) <= set(uses)):
            continue
        part = kept(cell)
        if part.strip():
            source.append(part)
    defined = {name for q in uses for name in parts[q]["globals"]}
    classes = {}
    for q, part in parts.items():
        for cls, method in part["methods"]:
            owner = next((o for o, p in parts.items() if cls in p["classes"]), None)
            classes.setdefault(cls, {"owner": owner, "methods": []})
            classes[cls]["methods"].append((q, method))
    bound = {}
    for cls, info in classes.items():
        used = [m for q, m in info["methods"] if q in uses]
        if info["owner"] in uses:
            bound[cls] = {"base": "ref", "other": [m for q, m in info["methods"] if q not in uses]}
        elif used:
            bound[cls] = {"base": "student", "other": used}
    globals_ = sorted(defined - set(bound))
    names = {q: [f"{cls}.{m}" for cls, m in parts[q]["methods"]]
             + [g for g in parts[q]["globals"] if g not in {m for _, m in parts[q]["methods"]}] for q in uses}
    return {"source": "\n\n\n".join(source) + "\n", "globals": globals_, "classes": bound, "uses": list(uses),
            "names": names, "define": needed_to_define(solution, question, uses)}


def needed_to_define(solution, question, uses):
    """The used answers' names that the question's answer cells need to be defined at all: in a decorator
    (`@add_to_class(FlatShard)`), a base class or a default value. When the student's is missing (its cell failed),
    the grader defines the solution's before those cells run (probe_runtime.fill_missing)."""
    parts = components(solution)
    used = {name for q in uses for name in parts[q]["globals"]}
    found = set()
    for cell in solution.cells:
        if question not in _questions(cell):
            continue
        for _, _, node in _definitions(cell):
            early = [*node.decorator_list, *getattr(node, "bases", []),
                     *getattr(getattr(node, "args", None), "defaults", [])]
            found |= {n for expr in early for n in _names(expr)} & used
    return sorted(found)


def references(solution, uses):
    """{question: reference} for every question of USES that uses an earlier answer."""
    return {q: ref for q, used in uses.items() if (ref := for_question(solution, q, used))}


# --- what the probes really call: read in the solution ------------------------------------------------------------

def _names(node):
    """Every name and attribute name a node's code uses."""
    found = set()
    for sub in ast.walk(node):
        if isinstance(sub, ast.Name):
            found.add(sub.id)
        elif isinstance(sub, ast.Attribute):
            found.add(sub.attr)
    return found


def computed_uses(solution, setup, probes):
    """{question: (earlier questions its probes reach)} read from the code: probe expressions, then the SETUP
    functions, answers (the solution's) and given functions and classes they name, transitively. A name is a global
    or an attribute (a method: `unit.unshard()` reaches lab 08's 8.2 through FlatShard)."""
    questions = order(solution)
    rank = {q: i for i, q in enumerate(questions)}
    defs = {}  # name -> [(question or None, node)]: functions, classes and methods of the solution's cells
    for cell in solution.cells:
        owners = _questions(cell)
        for name, _, node in _definitions(cell):
            for owner in owners or [None]:
                defs.setdefault(name, []).append((owner, node))
            if isinstance(node, ast.ClassDef):
                for item in node.body:
                    if isinstance(item, ast.FunctionDef):
                        for owner in owners or [None]:
                            defs.setdefault(item.name, []).append((owner, item))
    setup_defs = {}
    for node in ast.parse(setup or "").body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            setup_defs[node.name] = node
    out = {}
    for question in questions:
        exprs = [p.expr for p in probes if p.question == question]
        if not exprs:
            continue
        todo = set().union(*(_names(ast.parse(e, mode="eval")) for e in exprs))
        seen, uses = set(), set()
        while todo:
            name = todo.pop()
            if name in seen:
                continue
            seen.add(name)
            if name in setup_defs:
                todo |= _names(setup_defs[name])
            for owner, node in defs.get(name, []):
                if owner is not None and rank[owner] > rank[question]:
                    continue  # a later answer's name (a method called `step`, `forward`): not reached before it
                if owner is not None and owner != question:
                    uses.add(owner)
                todo |= _names(node)
        out[question] = tuple(sorted(uses, key=rank.get))
    return out


def composition_notes(marks, references):
    """{question: a sentence} where a question graded with the solution's earlier answers (reference.py) fares
    otherwise with the student's own: "3.4 passes with the reference `average_gradients`; with yours it fails (see
    3.3)". The score is the reference run's; this only informs."""
    notes = {}
    for question, reference in references.items():
        mine = marks.get(question, [])
        if not mine or not all("own" in m for m in mine):
            continue
        passed = all(m["earned"] == m["points"] for m in mine)
        own = all(m["own"] for m in mine)
        if passed == own:
            continue
        lost = [q for q in reference["uses"] if any(m["earned"] < m["points"] for m in marks.get(q, []))]
        used = lost or reference["uses"]
        names = ", ".join(f"`{name}`" for name in _names_of(reference, used))
        see = f" (see {', '.join(lost)})" if lost else ""
        if passed:
            notes[question] = f"{question} passes with the reference {names}; with yours it fails{see}"
        else:
            notes[question] = (f"{question} fails with the reference {names}; with yours it passes: your {question} "
                               "relies on something of yours that the lab does not ask for")
    return notes


def _names_of(reference, questions):
    """The names the reference binds for these questions, in the order of reference['globals'] and classes."""
    by_question = reference.get("names", {})
    names = [n for q in questions for n in by_question.get(q, [])]
    return list(dict.fromkeys(names)) or reference["globals"] + list(reference["classes"])


def leaked_lines(message, *secrets, shortest=24):
    """Whether message holds a line of any secret text (a reference's source, a probe's SETUP), compared with
    whitespace runs made one space; lines shorter than `shortest` characters (an import, `return x`) do not count."""
    text = " ".join(str(message).split())
    for secret in secrets:
        for line in (secret or "").splitlines():
            line = " ".join(line.split())
            if len(line) >= shortest and line in text:
                return True
    return False


def main(argv=None):
    """Print the USES the code shows for lab NN (the course's probes and solution, or those of PROBES=dir)."""
    from helpers.grading import probes as probe_files
    from helpers.grading.prepare.labgen import ROOT

    argv = sys.argv[1:] if argv is None else argv
    if not argv:
        print("usage: python -m helpers.grading.judge.reference NN [probes dir] [solutions dir]", file=sys.stderr)
        return 2
    lab = f"{int(argv[0]):02d}"
    setup, probes = probe_files.load(lab, argv[1] if len(argv) > 1 else None)
    solutions = pathlib.Path(argv[2]) if len(argv) > 2 else ROOT / "solutions"
    solution = nbformat.read(next(solutions.glob(f"{lab}_*.ipynb")), as_version=4)
    computed = {q: u for q, u in computed_uses(solution, setup, probes).items() if u}
    print(f"USES = {computed!r}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
