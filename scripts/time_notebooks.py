"""Time the execution of notebooks, one at a time, and print a Markdown table (INSTRUCTORS.md's times).

    .venv/bin/python scripts/time_notebooks.py chapters/*.ipynb solutions/*.ipynb > times.md

Each notebook runs with papermill in a fresh kernel, from its own folder, with its parameters cell as
committed (the small CI sizes), exactly as tests/test_labs.py runs them; executed copies go to a temporary
folder, the sources are not touched. A lab's time is its solution's: labs/NN is solutions/NN with the answers
removed, so a finished lab runs the same cells. Also counted per notebook: markdown and code cells, and the
words of markdown, from which INSTRUCTORS.md estimates reading and solving time, and the machine's
1-minute load average after each run (other work on the machine slows a run down).
"""
import json
import os
import pathlib
import re
import sys
import tempfile
import time

import papermill

ROOT = pathlib.Path(__file__).resolve().parent.parent
TIMEOUT_S = 900  # per cell; the slowest chapter runs in about a minute here


def cell_counts(path):
    """(markdown cells, code cells, markdown words) of a notebook."""
    cells = json.loads(pathlib.Path(path).read_text())["cells"]
    markdown = [c for c in cells if c["cell_type"] == "markdown"]
    code = [c for c in cells if c["cell_type"] == "code"]
    words = sum(len(re.findall(r"\w+", "".join(c["source"]))) for c in markdown)
    return len(markdown), len(code), words


def run(path, out_dir):
    """Seconds to execute the notebook at path with papermill."""
    start = time.perf_counter()
    papermill.execute_notebook(str(path), str(out_dir / path.name), kernel_name="python3",
                               cwd=str(path.parent), progress_bar=False, execution_timeout=TIMEOUT_S)
    return time.perf_counter() - start


def main(paths):
    print("| notebook | run (s) | markdown cells | code cells | markdown words | load after |")
    print("|---|---:|---:|---:|---:|---:|")
    with tempfile.TemporaryDirectory(prefix="time-notebooks-") as out:
        for name in paths:
            path = (ROOT / name).resolve() if not pathlib.Path(name).is_absolute() else pathlib.Path(name)
            md, code, words = cell_counts(path)
            try:
                seconds = f"{run(path, pathlib.Path(out)):.1f}"
            except Exception as error:  # noqa: BLE001 - one failed notebook must not stop the others
                seconds = f"failed ({type(error).__name__})"
                print(f"{path.name}: {error}", file=sys.stderr)
            load = os.getloadavg()[0]
            name = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
            row = [name, seconds, md, code, words, f"{load:.1f}"]
            print("| " + " | ".join(map(str, row)) + " |", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
