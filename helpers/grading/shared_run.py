"""One multi-rank run shared by every public check of a question, so a question launches its ranks once."""


class SharedRun:
    """shared(question, key, compute): compute() once per (question, key), its exception included.

    Only the latest key per question is kept: a student who edits an answer and reruns the check cell gets a new
    key (the checks build it from the answer's code), hence a fresh run. Every check of the question then reports
    the same failure when the run failed, each with its own name.
    """

    def __init__(self):
        self._last = {}  # question -> (key, (ok, value or exception))

    def __call__(self, question, key, compute):
        if question not in self._last or self._last[question][0] != key:
            try:
                outcome = (True, compute())
            except Exception as exc:  # noqa: BLE001 - reported by every check of the question
                outcome = (False, exc)
            self._last[question] = (key, outcome)
        ok, value = self._last[question][1]
        if not ok:
            raise value
        return value


def launch_on_gloo(fn, world_size, args, hang_timeout, hint=""):
    """Run fn on Gloo ranks for a check; a hang or a dead rank becomes a failure that says what to look at."""
    from helpers.errors import (  # here, so that importing this module stays light
        CollectiveHang,
        RankFailed,
    )
    from helpers.launch import launch

    try:
        return launch(fn, world_size, args=args, backend="gloo", hang_timeout=hang_timeout)
    except (CollectiveHang, RankFailed) as exc:
        if isinstance(exc, RankFailed) and exc.exitcode is None:
            raise  # an exception in the student's code: its own message is the best report
        raise AssertionError(f"the ranks did not finish together. {hint}Launcher's report: {exc}") from None
