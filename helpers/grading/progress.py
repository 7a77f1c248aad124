"""The class grader's progress bar: students done / total, elapsed, estimated remaining, who is running.

tqdm (already a dependency of papermill) draws it on stderr: in a terminal it redraws in place, in a log
(CI, `make grade > log`) it prints a line at most every 10 s.
"""
import sys

from tqdm import tqdm


class Progress:
    """`with Progress(n) as p: p.started(s); ...; p.finished(s)`."""

    def __init__(self, total):
        interactive = sys.stderr.isatty()
        self.bar = tqdm(total=total, unit="student", desc="grading", file=sys.stderr, dynamic_ncols=True,
                        mininterval=0.5 if interactive else 10.0, smoothing=0.0)
        self.running = []

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.bar.close()

    def started(self, student):
        self.running.append(student)
        self._show()

    def finished(self, student):
        self.running.remove(student)
        self.bar.update(1)
        self._show()

    def _show(self):
        self.bar.set_postfix_str(", ".join(self.running)[:60], refresh=False)
