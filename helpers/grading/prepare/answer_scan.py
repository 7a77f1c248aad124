"""Find a lab's answer code in other files: every solution region, normalised, against every file given.

A solution region is the code between `### BEGIN SOLUTION (lab N.M)` and `### END SOLUTION` in
solutions/NN_*.ipynb (helpers/grading/prepare/labgen.py defines the markers). Both sides are normalised the same way,
so that comments, blank lines, line breaks, spacing and quotes hide nothing:

| step | what is compared |
|---|---|
| parse | the code with `ast` (a notebook cell's `%magic` and `!shell` lines blanked first) |
| flatten | every statement, nested ones too, in source order, as `ast.dump` of its header: `for`, `if`, `def` |
|         | without their bodies, so a loop matches on its own line |
| exact | names kept: `flat /= dist.get_world_size()` matches only itself |
| renamed | every name, argument and function name replaced by `_`: `g /= dist.get_world_size()` matches too |

A file carries a region when it holds runs of at least WINDOW consecutive statements equal to runs of the
region (a region shorter than WINDOW must appear whole) and the statements those runs cover are at least
COVERAGE of the region's, counted once with names kept (exact) and once renamed (RENAMED_COVERAGE: a bar set
higher because `_ = _.grad` is common). Measured on this course (make release prints it): a chapter that teaches
the simpler version of a question shares 0-60 % of its statements with the answer; a copied region 100 %, and
still 100 % with its names, comments and spacing changed.
"""
import ast
import dataclasses
import functools
import json
import re
import textwrap

from helpers.grading.prepare.labgen import BEGIN, END

WINDOW = 3            # statements in a run; 2 matched one-liners that every training loop has
COVERAGE = 0.6        # share of a region's statements found, names kept
RENAMED_COVERAGE = 0.6
MAGIC = re.compile(r"^\s*[%!]")
FENCE = re.compile(r"^```(?:python|py)?\s*\n(.*?)^```", re.S | re.M)


@dataclasses.dataclass(frozen=True)
class Region:
    """One solution region: where it is and its code, dedented."""

    question: str
    notebook: str
    cell: int
    line: int     # of the BEGIN marker in its cell, from 1
    code: str

    @property
    def where(self):
        return f"solutions/{self.notebook} cell {self.cell} line {self.line}"


@dataclasses.dataclass(frozen=True)
class Finding:
    """A region found in a shipped file: which, where, and how much of it."""

    path: str
    unit: str     # "line 42" of a file, or "cell 7 line 3" of a notebook
    question: str
    region: str   # Region.where
    matched: int  # statements of the region found
    total: int
    renamed: bool  # found only once names were replaced

    def __str__(self):
        how = " (with names changed)" if self.renamed else ""
        return (f"{self.path} {self.unit}: lab {self.question}'s answer ({self.region}), "
                f"{self.matched} of its {self.total} statements{how}")


def solution_regions(notebooks):
    """Every region of every solution notebook ({name: nbformat notebook}), in order."""
    regions = []
    for name, notebook in sorted(notebooks.items()):
        for index, cell in enumerate(notebook.cells):
            if cell.cell_type != "code":
                continue
            question, body = None, []
            for number, line in enumerate(cell.source.splitlines(), start=1):
                if BEGIN.match(line):
                    question, start, body = BEGIN.match(line)["q"], number, []
                elif END.match(line) and question:
                    regions.append(Region(question, name, index, start, textwrap.dedent("\n".join(body))))
                    question = None
                elif question:
                    body.append(line)
    return regions


def code_units(path, text):
    """[(where, first line number, code)]: the Python a file holds (a .py file, notebook cells, fenced blocks)."""
    if path.endswith(".py"):
        return [("", 1, text)]
    if path.endswith(".ipynb"):
        units = []
        for index, cell in enumerate(json.loads(text).get("cells", [])):
            source = "".join(cell.get("source", []))
            if cell.get("cell_type") == "code":
                units.append((f"cell {index} ", 1, "\n".join("" if MAGIC.match(x) else x for x in source.split("\n"))))
            elif cell.get("cell_type") == "markdown":
                units += [(f"cell {index} ", source[:m.start(1)].count("\n") + 1, m[1]) for m in FENCE.finditer(source)]
        return units
    if path.endswith(".md"):
        return [("", text[:m.start(1)].count("\n") + 1, m[1]) for m in FENCE.finditer(text)]
    return []


class _Rename(ast.NodeTransformer):
    """Every identifier the author chose becomes `_`; attributes (`.grad`) and constants stay."""

    def visit_Name(self, node):
        return ast.copy_location(ast.Name(id="_", ctx=node.ctx), node)

    def visit_arg(self, node):
        node.arg, node.annotation = "_", None
        return node

    def visit_FunctionDef(self, node):
        node.name = "_"
        return self.generic_visit(node)

    visit_AsyncFunctionDef = visit_ClassDef = visit_FunctionDef


@functools.lru_cache(maxsize=None)
def statements(code, renamed=False):
    """((line, fingerprint), ...) of every statement in code, nested ones included; [] when it does not parse."""
    try:
        tree = ast.parse(textwrap.dedent(code))
    except (SyntaxError, ValueError):
        return ()
    if renamed:
        tree = _Rename().visit(tree)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.stmt):
            header = {field: [] if field in ("body", "orelse", "finalbody", "handlers", "cases") else value
                      for field, value in ast.iter_fields(node)}
            found.append((node.lineno, ast.dump(type(node)(**header))))
    return tuple(sorted(found, key=lambda item: item[0]))  # walk is breadth-first; source order reads better


def _runs(prints, sizes):
    """{size: {run of that many fingerprints: line of its first statement}} of a unit."""
    return {size: {tuple(p for _, p in prints[i:i + size]): prints[i][0] for i in range(len(prints) - size, -1, -1)}
            for size in sizes}


def _covered(region_prints, runs):
    """(statements of the region inside a run the unit shares, line in the unit of the first such run, or None)."""
    size = min(WINDOW, len(region_prints))
    covered, first = set(), None
    for i in range(len(region_prints) - size + 1):
        line = runs[size].get(tuple(region_prints[i:i + size]))
        if line is not None:
            covered.update(range(i, i + size))
            first = line if first is None else min(first, line)
    return len(covered), first


def measure(files, regions):
    """[(path, where, region, (exact count, line), (renamed count, line))] for every unit and region of files."""
    prints = [([p for _, p in statements(r.code)], [p for _, p in statements(r.code, renamed=True)])
              for r in regions]
    sizes = {min(WINDOW, len(mine)) for mine, _ in prints if mine}
    rows = []
    for path, text in sorted(files.items()):
        for where, offset, code in code_units(path, text):
            exact = statements(code)
            if not exact:
                continue
            runs, renamed_runs = _runs(exact, sizes), _runs(statements(code, renamed=True), sizes)
            for region, (mine, mine_renamed) in zip(regions, prints):
                if mine:
                    found = [_covered(mine, runs), _covered(mine_renamed, renamed_runs)]
                    found = [(count, None if line is None else line + offset - 1) for count, line in found]
                    rows.append((path, where, region, *found))
    return rows


def findings(rows):
    """[Finding] for every row of measure() where the unit carries the region."""
    found = []
    for path, where, region, (count, line), (renamed_count, renamed_line) in rows:
        total = len(statements(region.code))
        if count >= COVERAGE * total:
            found.append(Finding(path, f"{where}line {line}", region.question, region.where, count, total, False))
        elif renamed_count >= RENAMED_COVERAGE * total:
            found.append(Finding(path, f"{where}line {renamed_line}", region.question, region.where,
                                 renamed_count, total, True))
    return found


def coverage_table(rows):
    """{(path, question): (best share names kept, best share names replaced)} over the rows of measure()."""
    table = {}
    for path, _, region, (count, _), (renamed_count, _) in rows:
        total = len(statements(region.code))
        old = table.get((path, region.question), (0.0, 0.0))
        table[(path, region.question)] = (max(old[0], count / total), max(old[1], renamed_count / total))
    return table


def scan(files, regions):
    """[Finding] for every place in files ({path: text}) that carries a region."""
    return findings(measure(files, regions))
