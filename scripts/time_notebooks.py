"""Time the execution of notebooks, one at a time, and print a Markdown table (INSTRUCTORS.md's times).

    .venv/bin/python scripts/time_notebooks.py chapters/*.ipynb solutions/*.ipynb > times.md

Each notebook runs with papermill in a fresh kernel, from its own folder, with its parameters cell as
committed (the small CI sizes), exactly as tests/test_labs.py runs them; executed copies go to a temporary
folder, the sources are not touched. A lab's time is its solution's: labs/NN is solutions/NN with the answers
removed, so a finished lab runs the same cells. Also printed per notebook: its code cells and markdown words,
the main path apart from optional sections (counted by scripts/study_time.py, whose rule gives INSTRUCTORS.md's
study times; paste new run times into its MEASURED), and the machine's 1-minute load average after each run
(other work on the machine slows a run down).
"""
import os
import pathlib
import sys
import tempfile
import time

import papermill
from study_time import count

ROOT = pathlib.Path(__file__).resolve().parent.parent
TIMEOUT_S = 900  # per cell; the slowest chapter runs in about a minute here


def run(path, out_dir):
    """Seconds to execute the notebook at path with papermill."""
    start = time.perf_counter()
    papermill.execute_notebook(str(path), str(out_dir / path.name), kernel_name="python3",
                               cwd=str(path.parent), progress_bar=False, execution_timeout=TIMEOUT_S)
    return time.perf_counter() - start


def main(paths):
    print("| notebook | run (s) | code cells (main + optional) | markdown words (main + optional) | load after |")
    print("|---|---:|---:|---:|---:|")
    with tempfile.TemporaryDirectory(prefix="time-notebooks-") as out:
        for name in paths:
            path = (ROOT / name).resolve() if not pathlib.Path(name).is_absolute() else pathlib.Path(name)
            counts = count(path)
            try:
                seconds = f"{run(path, pathlib.Path(out)):.1f}"
            except Exception as error:  # noqa: BLE001 - one failed notebook must not stop the others
                seconds = f"failed ({type(error).__name__})"
                print(f"{path.name}: {error}", file=sys.stderr)
            load = os.getloadavg()[0]
            name = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
            row = [name, seconds, f"{counts.main_code} + {counts.optional_code}",
                   f"{counts.main_words} + {counts.optional_words}", f"{load:.1f}"]
            print("| " + " | ".join(map(str, row)) + " |", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
