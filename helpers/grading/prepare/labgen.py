"""Generate labs/NN_*.ipynb from solutions/NN_*.ipynb, the single source of each lab.

    python -m helpers.grading.prepare.labgen            # write labs/
    python -m helpers.grading.prepare.labgen --check    # exit 1 if labs/ differs from what would be written

In a solution, answer code sits between `### BEGIN SOLUTION (lab N.M) <what to do>` and
`### END SOLUTION`. The student version replaces the region by `# TODO(lab N.M): <what to do>` and
`raise NotImplementedError("lab N.M")` at the marker's indentation, drops outputs and execution
counts, keeps cell ids, and tags the cell with the questions it answers (the grader uses the tag).
"""
import argparse
import copy
import pathlib
import re
import sys

import nbformat

BEGIN = re.compile(r"^(?P<indent>[ \t]*)### BEGIN SOLUTION \(lab (?P<q>\d+\.\d+)\)\s*(?P<hint>.*)$")
END = re.compile(r"^[ \t]*### END SOLUTION\s*$")
ROOT = pathlib.Path(__file__).resolve().parents[3]


class MarkerError(ValueError):
    """A solution's markers are malformed; the message says which cell and line."""


def student_source(source, where="cell"):
    """The student's version of one cell's source, and the questions whose answers it removed."""
    out, questions, open_q = [], [], None
    for number, line in enumerate(source.splitlines(), start=1):
        begin, end = BEGIN.match(line), END.match(line)
        if begin:
            if open_q:
                raise MarkerError(f"{where} line {number}: BEGIN SOLUTION inside the region of lab {open_q}")
            open_q, indent = begin["q"], begin["indent"]
            hint = begin["hint"] or "write this part"
            out += [f"{indent}# TODO(lab {open_q}): {hint}", f'{indent}raise NotImplementedError("lab {open_q}")']
            questions.append(open_q)
        elif end:
            if not open_q:
                raise MarkerError(f"{where} line {number}: END SOLUTION without a BEGIN SOLUTION")
            open_q = None
        elif open_q is None:
            out.append(line)
    if open_q:
        raise MarkerError(f"{where}: the region of lab {open_q} is never closed with ### END SOLUTION")
    return "\n".join(out), questions


def student_notebook(solution):
    """A clean student notebook: answers removed, no outputs, no execution counts."""
    lab = copy.deepcopy(solution)
    for index, cell in enumerate(lab.cells):
        cell.metadata.pop("execution", None)
        if cell.cell_type != "code":
            continue
        cell.source, questions = student_source(cell.source, where=f"cell {index}")
        cell.outputs, cell.execution_count = [], None
        if questions:
            cell.metadata["dp_course"] = {"answers": questions}
    lab.metadata.pop("papermill", None)
    return lab


def render(notebook):
    """Deterministic JSON text of a notebook."""
    return nbformat.writes(notebook) + "\n"


def lab_texts(solutions_dir=ROOT / "solutions"):
    """{lab file name: text} for every solution notebook."""
    texts = {}
    for path in sorted(pathlib.Path(solutions_dir).glob("[0-9][0-9]_*.ipynb")):
        solution = nbformat.read(path, as_version=4)
        texts[path.name] = render(student_notebook(solution))
    return texts


def stale_labs(solutions_dir=ROOT / "solutions", labs_dir=ROOT / "labs"):
    """Lab files that are missing, differ from their solution, or have no solution."""
    expected = lab_texts(solutions_dir)
    present = {p.name for p in pathlib.Path(labs_dir).glob("*.ipynb")}
    stale = [name for name, text in expected.items()
             if name not in present or (pathlib.Path(labs_dir) / name).read_text() != text]
    return stale + sorted(present - set(expected))


def main(argv=None):
    parser = argparse.ArgumentParser(description="Generate labs/ from solutions/.")
    parser.add_argument("--check", action="store_true", help="only report labs that differ")
    options = parser.parse_args(argv)
    if options.check:
        stale = stale_labs()
        for name in stale:
            print(f"labs/{name} differs from solutions/{name}: run `make labs` (never edit labs/ by hand)")
        return 1 if stale else 0
    (ROOT / "labs").mkdir(exist_ok=True)
    for name, text in lab_texts().items():
        (ROOT / "labs" / name).write_text(text)
        print(f"wrote labs/{name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
