"""A live line in the notebook cell while a launch runs: "running 3 ranks, 6 s: ranks 0 and 2 wait in ...".

Shown only in a Jupyter kernel, and only once a run has taken longer than `after_s`: fast runs and plain
scripts print nothing extra. The line is one display output, updated in place and emptied at the end.
"""
import time

from helpers.launcher.forkserver import in_kernel
from helpers.launcher.hang import COLLECTIVES

# A run shorter than this needs no progress line (seconds).
SHOW_AFTER_S = 2.0
# Refresh the line at most this often (seconds): each update is a message to the front end.
_REFRESH_S = 0.5


def _ranks(ranks):
    ranks = sorted(ranks)
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    return "ranks " + ", ".join(map(str, ranks[:-1])) + f" and {ranks[-1]}"


class Waits:
    """Since when each rank has been in the collective it reports (the report itself has no clock)."""

    def __init__(self):
        self.since = {}  # rank -> ((op, seq), first seen)

    def update(self, reports, now):
        for rank, report in reports.items():
            key = (report.get("op"), report.get("seq"))
            if report.get("phase") != "running" or report.get("op") not in COLLECTIVES:
                self.since.pop(rank, None)
            elif self.since.get(rank, (None,))[0] != key:
                self.since[rank] = (key, now)

    def longest(self, now):
        """(key, ranks waiting in it, seconds) of the collective waited in longest, or None."""
        if not self.since:
            return None
        key, first = min(self.since.values(), key=lambda v: v[1])
        ranks = [r for r, (k, _) in self.since.items() if k == key]
        return key, ranks, now - first


def status_text(world_size, elapsed, waits, finished, live, now):
    """'running 3 ranks, 6 s: ranks 0 and 2 wait in all_reduce #4; waiting for rank 1 since 4 s'."""
    text = f"running {world_size} ranks, {elapsed:.0f} s"
    longest = waits.longest(now)
    if longest is None:
        return text + (f"; {_ranks(finished)} finished" if finished else "")
    (op, seq), ranks, seconds = longest
    others = sorted(set(live) - set(ranks))
    text += f": {_ranks(ranks)} {'waits' if len(ranks) == 1 else 'wait'} in {op} #{seq}"
    if others:
        text += f"; waiting for {_ranks(others)} since {seconds:.0f} s"
    if finished:
        text += f"; {_ranks(finished)} finished"
    return text


class RunStatus:
    """The progress line of one launch; does nothing outside a Jupyter kernel."""

    after_s = SHOW_AFTER_S

    def __init__(self, world_size):
        self.world_size = world_size
        self.enabled = in_kernel()
        self.handle, self.shown_at = None, 0.0
        self.waits = Waits()

    def show(self, elapsed, reports, finished, live):
        """Update the line from the ranks' latest reports (dicts by rank) once the run is slow enough."""
        now = time.monotonic()
        self.waits.update({r: reports[r] for r in live if r in reports}, now)
        if not self.enabled or elapsed < self.after_s or now - self.shown_at < _REFRESH_S:
            return
        self.shown_at = now
        text = status_text(self.world_size, elapsed, self.waits, sorted(finished), live, now)
        self._publish(text)

    def _publish(self, text):
        from IPython.display import display

        bundle = {"text/plain": text}
        if self.handle is None:
            self.handle = display(bundle, raw=True, display_id=True)
        else:
            self.handle.update(bundle, raw=True)

    def clear(self):
        """Empty the line when the run ends, so only the ranks' own output stays in the cell."""
        if self.handle is not None:
            self.handle.update({"text/plain": ""}, raw=True)
            self.handle = None
