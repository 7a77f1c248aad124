"""Put the install cell (Colab and other hosted Jupyters) first among the code cells of every notebook.

    .venv/bin/python scripts/colab_cell.py      # chapters/ and solutions/; then `make labs` for labs/

Where `helpers` imports (make lab, JupyterHub after `pip install`, the grader) the cell does nothing. Where it
does not (a notebook opened on Colab from the repository), it clones COURSE_REPO, installs it with
`pip install -e` and moves into the clone's folder of that notebook, so relative paths work as they do here.
In this repository COURSE_REPO is empty: the course has no public address until an instructor publishes the
student edition, and `make release COURSE_REPO=<url>` writes that address into every notebook it ships (it
refuses to release without one). With COURSE_REPO empty, the cell says how to install the course instead.
tests/test_install.py checks that every notebook carries the current cell, and runs the cell's install branch
against a local clone.

The cell is inserted with no outputs: chapters keep their committed outputs (it prints nothing where
`helpers` imports), and nbval still runs it.
"""
import pathlib
import sys

import nbformat

ROOT = pathlib.Path(__file__).resolve().parent.parent
COURSE_REPO = ""  # this repository has no public address; make release COURSE_REPO=<url> writes the release's
CELL_ID = "install-course"
FOLDERS = ("chapters", "solutions")

TEMPLATE = '''\
# Colab, or a Jupyter without the course: this cell clones the course, installs it with
# `pip install -e` (a few minutes: PyTorch is large) and moves into the clone's {folder}/ folder.
# If Colab then asks to restart the session, do so and run this cell again.
# Where `helpers` already imports (make lab, JupyterHub, the grader), it only imports it.
COURSE_REPO = "{repo}"  # the course's public repository; empty in a copy that was never published
import importlib.util
if importlib.util.find_spec("helpers") is None:
    import os, subprocess, sys
    if not COURSE_REPO:
        raise RuntimeError("the course is not installed in this Jupyter and this copy names no repository to "
                           "clone: open the notebook from a clone with `make lab`, or `pip install -e` the clone")
    course = os.path.abspath("data-parallelism-hands-on")
    if not os.path.isdir(course):
        subprocess.run(["git", "clone", "--depth", "1", COURSE_REPO, course], check=True)
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "-e", course], check=True)
    sys.path.insert(0, course)  # the editable install is seen by new kernels; this one needs the path now
    os.chdir(os.path.join(course, "{folder}"))
    print(f"installed the course from {{COURSE_REPO}} into {{course}}; working in {{os.getcwd()}}")
else:
    import helpers  # in Jupyter, this starts the process that forks the ranks, in the background, while you read'''

# A lab's notebook is generated from solutions/ but opened from labs/ (the student release has no solutions/).
WORKING_FOLDER = {"chapters": "chapters", "solutions": "labs", "labs": "labs"}


def cell_source(folder, repo=COURSE_REPO):
    """The install cell's source for a notebook in folder (chapters, solutions or labs)."""
    return TEMPLATE.format(folder=folder, repo=repo)


def install_cell(folder):
    cell = nbformat.v4.new_code_cell(cell_source(folder))
    cell.id = CELL_ID
    cell.metadata = {"dp_course": {"install": True}}
    return cell


def stamp(path):
    """Insert or update the install cell as the first code cell of the notebook at path; True if changed."""
    nb = nbformat.read(path, as_version=4)
    folder = WORKING_FOLDER[path.parent.name]
    existing = [i for i, c in enumerate(nb.cells) if c.get("id") == CELL_ID]
    if existing:
        cell = nb.cells[existing[0]]
        if cell.source == cell_source(folder):
            return False
        cell.source = cell_source(folder)
    else:  # after the title cell, so it is the first code cell and comes before the parameters
        first_code = next(i for i, c in enumerate(nb.cells) if c.cell_type == "code")
        nb.cells.insert(min(1, first_code), install_cell(folder))
    nbformat.write(nb, path)
    return True


def main():
    changed = [p for folder in FOLDERS for p in sorted((ROOT / folder).glob("*.ipynb")) if stamp(p)]
    for path in changed:
        print(f"install cell written: {path.relative_to(ROOT)}")
    print(f"{len(changed)} notebook(s) changed; run `make labs` to update labs/", file=sys.stderr)


if __name__ == "__main__":
    main()
