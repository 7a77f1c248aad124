"""One multi-rank call seen from the kernel: start ranks, stream output, collect results, tear down."""
import signal
import sys
import time
from multiprocessing.connection import wait as wait_any

import cloudpickle

from helpers.errors import CollectiveHang, CollectiveMismatch, RankFailed
from helpers.launcher.collective_check import mismatch_text
from helpers.launcher.collective_text import differences
from helpers.launcher.hang import (
    DEADLOCK_HINT,
    certain_deadlock,
    deadlock_summary,
    describe_rank,
    hang_hint,
)
from helpers.launcher.main_guard import bootstrap_hint
from helpers.launcher.rank_output import RankOutput
from helpers.launcher.run_status import RunStatus
from helpers.launcher.traceback_text import (
    format_abort,
    format_rank_error,
    is_secondary_error,
)
from helpers.launcher.worker import main as worker_main

# What the kernel keeps of each rank's stderr (characters): the end of it explains a crash (Gloo's message).
_STDERR_TAIL = 4000
# After the first failure, how long to wait for the others (seconds): a crash on one rank makes
# its peers fail with "connection reset", and the report should name the crash, not the echo.
_GRACE_S = 0.2
# How long ranks get to answer a report request when one rank is stuck (seconds).
_REPORT_S = 2.0
# How often to ask the running ranks where they are (seconds): often once a rank has returned, since a peer
# blocked in a collective that rank will never join is a certain deadlock; seldom for the progress line.
_ASK_AFTER_RETURN_S = 0.2
_ASK_FOR_PROGRESS_S = 1.0
_CONFIRM_S = 0.2  # a certain deadlock is reported once fresh reports show it this long


class Run:
    """The processes and connections of one launch; a context manager that always tears down."""

    def __init__(self, context, world_size, spec):
        self.world_size = world_size
        self.spec = spec
        self.conns, self.procs = [], []
        self.results, self.final_seq = {}, {}
        self.reports = {}  # rank -> its latest answer to ("report",)
        self.report_times = {}  # rank -> when that answer came
        self.first_blocked = {}  # rank -> (seq, time of the answer that first showed it blocked there)
        self.aborts = {}  # rank -> where it was when it got SIGABRT (its last message)
        self.alive = set()  # ranks whose worker started (sent "started")
        self.stderr_tail = {}  # rank -> the end of what it wrote to stderr
        self.started, self.asked = time.monotonic(), 0.0
        self.output = RankOutput(sys.stdout, sys.stderr)
        self.status = RunStatus(world_size)
        for rank in range(world_size):
            parent, child = context.Pipe(duplex=True)
            proc = context.Process(target=worker_main, args=(rank, world_size, spec, child),
                                   name=f"rank-{rank}", daemon=True)
            proc.start()
            child.close()
            self.conns.append(parent)
            self.procs.append(proc)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def wait(self):
        """Serve the ranks until all returned; raise RankFailed or CollectiveHang otherwise."""
        failures, stuck = [], None
        live = set(range(self.world_size))
        deadline = None
        while live and (deadline is None or time.monotonic() < deadline):
            for rank, message in self._next_messages(live, timeout=0.1):
                kind = message[0]
                if kind == "out":
                    self.output.write(rank, message[1], message[2])
                    if message[1] == "stderr":
                        self.stderr_tail[rank] = (self.stderr_tail.get(rank, "") + message[2])[-_STDERR_TAIL:]
                elif kind == "aborting":
                    self.aborts[rank] = message[1]
                elif kind == "started":
                    self.alive.add(rank)
                elif kind == "result":
                    self.results[rank] = cloudpickle.loads(message[1])
                    self.final_seq[rank] = message[2]
                    live.discard(rank)
                elif kind in ("error", "unpicklable", "died"):
                    failures.append((rank, message))
                    live.discard(rank)
                elif kind == "stuck" and stuck is None:
                    stuck = message[1]
                elif kind == "report":
                    self.reports[rank], self.report_times[rank] = message[1], time.monotonic()
            if (failures or stuck) and deadline is None:
                deadline = time.monotonic() + (_GRACE_S if failures else 0.0)
            if deadline is None and live:
                blocked = certain_deadlock([self.reports[r] for r in live if r in self.reports], self.final_seq)
                if blocked and self._confirmed(blocked, live):
                    self.output.flush()
                    raise self._deadlock(blocked)
                self._ask_where(live)
        self.output.flush()
        if failures:
            raise self._rank_failed(failures)
        if stuck is not None:
            raise self._hang(stuck)
        return [self.results[r] for r in range(self.world_size)]

    def _ask_where(self, live):
        """Ask the running ranks for a report now and then; show the progress line from their answers."""
        now = time.monotonic()
        period = _ASK_AFTER_RETURN_S if self.results else _ASK_FOR_PROGRESS_S
        if now - self.asked >= period and (self.results or now - self.started >= self.status.after_s):
            self.asked = now
            for rank in live:
                try:
                    self.conns[rank].send(("report",))
                except (OSError, ValueError):
                    pass  # the process is gone: its sentinel says so on the next turn
        self.status.show(now - self.started, self.reports, self.final_seq, live)

    def _next_messages(self, live, timeout):
        """Messages ready now, as (rank, message); a dead process becomes a "died" message."""
        by_handle = {}
        for rank in live:
            by_handle[self.conns[rank]] = rank
            by_handle[self.procs[rank].sentinel] = rank
        ready = wait_any(list(by_handle), timeout=timeout)
        messages = []
        for handle in ready:
            rank = by_handle[handle]
            if handle is self.conns[rank]:
                messages.extend((rank, m) for m in self._drain(rank))
            elif not self.conns[rank].poll():  # read everything it sent before calling it dead
                messages.append((rank, ("died", self.procs[rank].exitcode)))
        return messages

    def _drain(self, rank):
        conn, out = self.conns[rank], []
        try:
            while conn.poll():
                out.append(conn.recv())
        except (EOFError, OSError):
            self.procs[rank].join(timeout=1.0)
            out.append(("died", self.procs[rank].exitcode))
        return out

    def _rank_failed(self, failures):
        # Prefer the root cause: a rank that crashed on its own over peers that lost their connection.
        rank, message = min(failures, key=lambda f: (is_secondary_error(f[1]), f[0]))
        kind = message[0]
        if kind == "died":
            code = message[1]
            how = f"was killed by signal {_signal_name(-code)}" if code is not None and code < 0 \
                else f"exited with code {code}"
            if (self.aborts.get(rank) or {}).get("call"):
                return RankFailed(self._abort_report(rank, how, failures), rank=rank, exitcode=code)
            if rank not in self.alive:
                return RankFailed(f"rank {rank} {how} while starting, before running your function. "
                                  + bootstrap_hint(), rank=rank, exitcode=code)
            return RankFailed(f"rank {rank} {how} before returning (os._exit, a crash, or out of memory?); "
                              "the other ranks were stopped", rank=rank, exitcode=code)
        if kind == "unpicklable":
            info = message[1]
            return RankFailed(f"rank {rank} returned a {info['type']} that cannot be sent back to the "
                              f"notebook ({info['message']}); return plain data or tensors, e.g. "
                              "t.detach().cpu() or model.state_dict()", rank=rank)
        info = message[1]
        if info["type"] == "CollectiveMismatch" and info.get("calls"):
            return CollectiveMismatch(mismatch_text(info["calls"]), calls=info["calls"])
        return RankFailed(format_rank_error(rank, info), rank=rank, exc_type=info["type"])

    def _abort_report(self, rank, how, failures):
        """A rank aborted inside a collective: where every rank was, and why Gloo says it aborted."""
        where = {r: ("aborted", report) for r, report in self.aborts.items()}
        for r, message in failures:
            if r not in where and message[0] == "error":
                where[r] = ("raised", message[1])
            elif r not in where:
                where[r] = ("died", None)
        for r in range(self.world_size):
            if r not in where:  # still running (blocked in the collective?) or finished: ask
                where[r] = ("running", self._ask_report(r))
        return format_abort(rank, how, where, self.stderr_tail.get(rank, ""))

    def _confirmed(self, blocked, live):
        """Every blocked rank seen at the same collective again in an answer _CONFIRM_S after the first.

        A report can be a moment old: a rank seen in all_reduce #25 may have finished it as its peer returned
        (point-to-point ops make sequence numbers differ between ranks). Chapter 02 hit that false alarm. Each
        rank is confirmed on its own answers: waiting for all answers of one round to come together made a
        3-rank deadlock take up to 8 s on a loaded machine (one answer came, reset the wait, the other came...)."""
        for rank in set(self.first_blocked) - {r["rank"] for r in blocked}:
            del self.first_blocked[rank]  # no longer blocked there
        confirmed = True
        for report in blocked:
            rank, seq, at = report["rank"], report.get("seq"), self.report_times.get(report["rank"], 0.0)
            first = self.first_blocked.get(rank)
            if first is None or first[0] != seq:
                self.first_blocked[rank] = (seq, at)
                confirmed = False
            elif at - first[1] < _CONFIRM_S:
                confirmed = False
        return confirmed

    def _deadlock(self, blocked):
        """A CollectiveHang raised at once: a rank returned, and its peers wait in a collective it never joins."""
        reports = {r["rank"]: r for r in blocked}
        for rank, seq in self.final_seq.items():
            reports[rank] = {"rank": rank, "phase": "finished", "seq": seq}
        for rank in range(self.world_size):
            if rank not in reports:  # a fresh answer: where it is now, for the whole picture
                reports[rank] = self._ask_report(rank)
        blocked = certain_deadlock(list(reports.values()), self.final_seq) or blocked
        lines = [describe_rank(reports[r]) for r in sorted(reports)]
        message = (deadlock_summary(self.final_seq, blocked) + "\n  " + "\n  ".join(lines) + "\n"
                   + _calls_differ(reports.values()) + DEADLOCK_HINT)
        return CollectiveHang(message, reports=[reports[r] for r in sorted(reports)])

    def _hang(self, first):
        reports = {first["rank"]: first}
        for rank in range(self.world_size):
            if rank not in reports:
                reports[rank] = self._ask_report(rank)
        lines = [describe_rank(reports[r]) for r in sorted(reports)]
        timeout = self.spec["hang_timeout"]
        message = (f"no progress for {timeout:g} s: the ranks are waiting for each other.\n  "
                   + "\n  ".join(lines) + "\n" + _calls_differ(reports.values()) + hang_hint(reports.values()))
        return CollectiveHang(message, reports=[reports[r] for r in sorted(reports)])

    def _ask_report(self, rank):
        if rank in self.results:
            return {"rank": rank, "phase": "finished", "seq": self.final_seq[rank]}
        conn = self.conns[rank]
        try:
            conn.send(("report",))
            deadline = time.monotonic() + _REPORT_S
            while conn.poll(max(0.0, deadline - time.monotonic())):
                message = conn.recv()
                if message[0] == "report":
                    return message[1]
                if message[0] == "out":
                    self.output.write(rank, message[1], message[2])
                if message[0] == "result":  # it finished after all: its count is final
                    return {"rank": rank, "phase": "finished", "seq": message[2]}
        except (EOFError, OSError):
            pass
        return {"rank": rank, "phase": "gone"}

    def close(self):
        """Release finished ranks, stop the rest (SIGTERM, then SIGKILL), close every pipe."""
        for conn in self.conns:
            try:
                conn.send(("exit",))
            except (OSError, ValueError):
                pass
        finished = [self.procs[r] for r in self.results]
        _stop(finished, grace=0.5)
        # A rank that did not finish is blocked or failing: nothing of it is worth waiting for.
        _stop([p for p in self.procs if p not in finished], grace=0.0)
        for conn in self.conns:
            conn.close()
        self.output.flush()
        self.status.clear()


def _calls_differ(reports):
    """'The waiting ranks' calls differ in tensor: ...' and a newline, when the blocked ranks' calls differ; else ''."""
    calls = {r["rank"]: r["call"] for r in reports if r.get("phase") == "running" and r.get("call")}
    diff = differences(calls) if len(calls) > 1 else []
    if not diff:
        return ""
    return ("The waiting ranks' calls differ in " + "; ".join(diff) + "; launch(..., check_collectives=True) stops "
            "at the first call that differs.\n")


def _signal_name(number):
    """'6 (SIGABRT)'."""
    try:
        return f"{number} ({signal.Signals(number).name})"
    except ValueError:
        return str(number)


def _stop(procs, grace):
    deadline = time.monotonic() + grace
    for proc in procs:
        proc.join(timeout=max(0.0, deadline - time.monotonic()))
    for proc in procs:
        if proc.is_alive():
            proc.terminate()
    deadline = time.monotonic() + 0.5
    for proc in procs:
        proc.join(timeout=max(0.0, deadline - time.monotonic()))
        if proc.is_alive():
            proc.kill()
            proc.join()
