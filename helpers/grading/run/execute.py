"""Execute a graded notebook cell by cell in a sandboxed kernel, with a per-cell and a total time limit.

A cell that overruns its limit is interrupted; one that ignores the interrupt for `grace_seconds` more is
killed with its whole sandbox. So is one that kills its own kernel. Either way the grader starts a new
kernel, replays the lab's cells and the earlier answers (never the one that hung or killed the kernel,
never the probes) and goes on with the next cell: a hung question costs only that question.
"""
import copy
import dataclasses
import math
import subprocess
import threading
import time
from queue import Empty

import nbformat
from jupyter_client import BlockingKernelClient
from nbclient import NotebookClient
from nbclient.exceptions import DeadKernelError

from helpers.grading.run.channel import Channel
from helpers.grading.run.messages import WellFormed
from helpers.grading.run.sandbox import (
    FILE_BYTES,
    Fences,
    kill_session,
    make_kernel_manager,
    runtime_overfull,
    working_directory,
)

_ORDER = ["ok", "error", "timeout", "dead_kernel", "memory_limit"]


@dataclasses.dataclass
class Limits:
    """How much one submission may use, and the fences around its kernel."""

    cell_seconds: float = 60.0
    total_seconds: float = 300.0
    grace_seconds: float = 5.0  # after the interrupt, before the kernel is killed
    memory_bytes: int = 4 * 2**30  # each process of a kernel (prlimit --as)
    # The kernel with its ranks and their tmpfs, in a memory cgroup: 4 ranks and the kernel could each hold
    # memory_bytes (20 GiB); the kernel's cgroup holds them all to what one may hold (the solutions of labs 07, 09 and
    # 10 peaked at 0.49-0.58 GiB, kernel and ranks). And the student's grading process (what the kernel sends it:
    # outputs, the probes' values, the executed notebook), by how much it may grow: cgroup.py.
    kernel_memory_bytes: int = 4 * 2**30
    grader_memory_bytes: int = 2 * 2**30
    file_bytes: int = FILE_BYTES  # any one file a kernel writes, its log included (with memory_bytes, by prlimit)
    max_tasks: int = 512  # processes and threads of one kernel (4 ranks use about 100)
    fences: Fences = Fences(sandbox=False, drop_user=False, memory=False)
    hidden_dirs: tuple = ()
    readonly_dirs: tuple = ()
    log_path: str = ""  # where the kernel's own stdout/stderr go ("" = discarded)
    preload_dynamo: bool = True  # the launcher's forkserver imports torch._dynamo (see helpers/launch.py)
    threads: int = 0  # torch's intra-op threads in the kernel (OMP_NUM_THREADS); 0 = torch's default, all cores
    output_chars: int = 1_000_000  # of each cell's outputs, whatever their type, kept in the executed notebook


@dataclasses.dataclass
class Execution:
    """What happened: overall status, one log row per cell, and how many kernels it took."""

    status: str = "ok"  # ok | error | timeout | dead_kernel | memory_limit
    cells: list = dataclasses.field(default_factory=list)
    kernels: int = 0
    records: list = dataclasses.field(default_factory=list)  # the lines the kernels wrote on the probes' pipes


def _worst(a, b):
    return max(a, b, key=_ORDER.index)


def _kind(cell):
    return cell.metadata.get("dp_course_kind")


def _errored(cell):
    errors = [o for o in cell.get("outputs", []) if o.get("output_type") == "error"]
    if not errors:
        return "ok"
    # Our interrupt at the time limit reaches the cell as KeyboardInterrupt (run() checks it was ours).
    return "timeout" if errors[0].get("ename") == "KeyboardInterrupt" else "error"


# A cell printing gigabytes would fill the grader's memory and the executed notebook.
MAX_OUTPUT_CHARS = Limits.output_chars


class _CappedClient(WellFormed, NotebookClient):
    """A NotebookClient that keeps at most max_chars of output per cell, of every type, then one line saying so.

    No output is exempt: the probes' values come by their own pipe (run/channel.py), not as an output (an answer that
    displayed 435 MiB in the probes' own MIME type, which the cap once let through, made a 435 MiB notebook). A display
    update counts once for each output it rewrites, in whichever cell: a thousand outputs of one display id, updated
    with a megabyte, are a gigabyte of notebook."""

    def __init__(self, *args, max_chars=MAX_OUTPUT_CHARS, **kwargs):
        super().__init__(*args, **kwargs)
        self.max_chars = max_chars
        self.used_chars = {}  # cell index -> characters of output kept
        self.running = None, None  # (index, cell) of the cell being run: display updates are charged to it

    def _charge(self, cell_index, size, outs):
        """Whether size more characters fit in the cell's cap (and count them); the first refusal says so."""
        used = self.used_chars.get(cell_index, 0)
        if used + size <= self.max_chars:
            self.used_chars[cell_index] = used + size
            return True
        if used <= self.max_chars:
            self.used_chars[cell_index] = self.max_chars + 1
            outs.append(nbformat.v4.new_output(
                "stream", name="stderr", text=f"[grader] output beyond {self.max_chars:,} characters dropped\n"))
        return False

    def output(self, outs, msg, display_id, cell_index):
        if self._charge(cell_index, len(str(msg["content"])), outs):
            return super().output(outs, msg, display_id, cell_index)
        return None

    def _update_display_id(self, display_id, msg):
        rewrites = sum(len(indices) for indices in self._display_id_map.get(display_id, {}).values())
        index, cell = self.running
        if rewrites and cell is not None and self._charge(index, rewrites * len(str(msg["content"])), cell.outputs):
            super()._update_display_id(display_id, msg)


class _Kernel:
    """One sandboxed kernel and its client; killed on exit, whatever happened inside."""

    def __init__(self, notebook, workdir, limits):
        self.limits, self.workdir = limits, workdir
        self.channel = Channel()  # the probes' pipe, into the kernel when it starts
        try:
            self.km = make_kernel_manager(workdir, limits, self.channel.fd)
        except Exception:
            self.channel.lines()
            raise
        # No nbclient timeout: after its own interrupt it stops watching whether the kernel lives, and waits a
        # whole timeout more. The watch below interrupts and kills; nbclient notices a death within 1 s.
        self.client = _CappedClient(notebook, km=self.km, timeout=None, allow_errors=True, startup_timeout=60,
                                    shutdown_kernel="immediate", max_chars=limits.output_chars,
                                    resources={"metadata": {"path": working_directory(workdir)}})
        # why the kernel was lost: "timeout", "died", "tasks" (it hit the task limit), "memory" (its memory cgroup's
        # limit) or "disk" (see _Watch)
        self.lost = None

    def kill(self, why="timeout"):
        self.lost = self.lost or why
        kill_session(self.km)

    def run(self, cell, index, seconds):
        """Execute cell; interrupt it at `seconds`, kill its kernel `grace_seconds` later. Returns its status."""
        self.lost = None
        self.client.used_chars.pop(index, None)
        self.client.running = index, cell
        watch, dropped = _Watch(self, seconds), self.client.dropped
        watch.start()
        try:
            self.client.execute_cell(cell, index)
        except DeadKernelError:
            self.lost = self.lost or "died"
        except Exception:  # noqa: BLE001 - what the kernel sent made nbclient fail: the student's, not the grader's
            self.kill("message")
        finally:
            watch.stop()
        if self.client.dropped > dropped:  # malformed messages (run/messages.py)
            note = f"[grader] {self.client.dropped - dropped} malformed message(s) from the kernel dropped\n"
            cell.outputs.append(nbformat.v4.new_output("stream", name="stderr", text=note))
        if not self.lost and runtime_overfull(self.workdir):  # a cell quicker than the watch's first look
            self.kill("disk")
        if self.km.memory is not None and self.km.memory.limit_hits() > watch.memory_hits:
            self.lost = None  # its cgroup's out-of-memory killer, not the kernel's own death: say why
            self.kill("memory")
        if self.lost:
            return {"timeout": "timeout", "died": "dead_kernel", "tasks": "error", "disk": "error",
                    "message": "error", "memory": "error"}[self.lost]
        status = _errored(cell)
        return "timeout" if status == "timeout" and watch.interrupted else status

    def interrupt(self):
        """Ask the kernel to interrupt itself (interrupt_mode "message"), from the watch's thread."""
        client = BlockingKernelClient()
        client.load_connection_info(self.km.get_connection_info())
        client.start_channels(shell=False, iopub=False, stdin=False, hb=False, control=True)
        try:
            client.control_channel.send(client.session.msg("interrupt_request", {}))
            client.control_channel.get_msg(timeout=2)  # the interrupt_reply: the request was delivered
        except Empty:
            pass
        finally:
            client.stop_channels()


class _Watch(threading.Thread):
    """Watches one cell: interrupt at its limit, kill after the grace, kill at once on a fork bomb or on files piling
    up in the one directory of the grader's disk the sandbox lets it write (its sockets')."""

    def __init__(self, kernel, seconds):
        super().__init__(daemon=True)
        self.kernel, self.seconds, self.interrupted = kernel, seconds, False
        self.memory_hits = kernel.km.memory.limit_hits() if kernel.km.memory else 0
        self.done = threading.Event()

    def run(self):
        cgroup, memory = self.kernel.km.cgroup, self.kernel.km.memory
        hits, start = cgroup.limit_hits() if cgroup else 0, time.monotonic()
        while not self.done.wait(0.2):
            elapsed = time.monotonic() - start
            # A fork bomb leaves hundreds of kernel copies behind: its kernel is not fit to go on.
            if cgroup and cgroup.limit_hits() > hits:
                return self.kernel.kill("tasks")
            # Its memory cgroup killed a process (a rank, or the kernel): what is left is not fit to go on either.
            if memory and memory.limit_hits() > self.memory_hits:
                return self.kernel.kill("memory")
            if runtime_overfull(self.kernel.workdir):
                return self.kernel.kill("disk")
            if elapsed >= self.seconds + self.kernel.limits.grace_seconds:
                return self.kernel.kill("timeout")
            if elapsed >= self.seconds and not self.interrupted:
                self.interrupted = True
                self.kernel.interrupt()

    def stop(self):
        self.done.set()
        self.join()


def execute(notebook, workdir, limits):
    """Run every cell; never raises for what the notebook does. Returns an Execution."""
    result, never_replay, start = Execution(), set(), 0
    deadline = [math.inf]  # set when the first kernel is up: a slow start on a loaded host is not the student's
    with open(limits.log_path or "/dev/null", "ab") as log:
        while start is not None:
            start = _session(notebook, workdir, limits, result, start, never_replay, deadline, log)
    return result


def _session(notebook, workdir, limits, result, start, never_replay, deadline, log):
    """Run cells from `start` in a new kernel; return where the next kernel should go on (None: done)."""
    kernel = _Kernel(notebook, workdir, limits)
    result.kernels += 1
    try:
        with kernel.client.setup_kernel(stdout=log, stderr=subprocess.STDOUT):
            kernel.channel.started()  # the kernel holds the pipe's write end: the grader's copy goes
            if deadline[0] == math.inf:
                deadline[0] = time.monotonic() + limits.total_seconds
            # The wall clock kills the kernel whatever the cells do.
            killer = threading.Timer(max(0.0, deadline[0] - time.monotonic()) + limits.grace_seconds, kernel.kill)
            killer.start()
            try:
                if not _replay(kernel, notebook, start, never_replay, deadline[0], result):
                    return None
                return _run_from(kernel, notebook, start, never_replay, deadline[0], result)
            finally:
                killer.cancel()
    except DeadKernelError:  # died between cells, or while shutting down
        return None
    except RuntimeError as exc:  # the kernel did not even start
        result.status = _worst(result.status, "dead_kernel")
        result.cells.append({"index": -1, "kind": "kernel", "status": "dead_kernel", "seconds": 0.0, "error": str(exc)})
        return None
    finally:
        if kernel.lost == "memory":  # the cell is an error with the grader's note; the student's status says why
            result.status = _worst(result.status, "memory_limit")
        kernel.kill()
        result.records += kernel.channel.lines()
        for group in (kernel.km.cgroup, kernel.km.memory):
            if group is not None:
                group.remove()


def _replay(kernel, notebook, stop, never_replay, deadline, result):
    """Re-run, on copies, the lab cells and answers before `stop` that a new kernel needs. False: it failed."""
    for index, cell in enumerate(notebook.cells[:stop]):
        if cell.cell_type != "code" or _kind(cell) not in ("lab", "answer") or index in never_replay:
            continue
        remaining = deadline - time.monotonic()
        status = kernel.run(copy.deepcopy(cell), index, min(kernel.limits.cell_seconds, remaining)) \
            if remaining > 0 else "timeout"
        result.cells.append({"index": index, "kind": f"replay-{_kind(cell)}", "status": status, "seconds": 0.0})
        if kernel.lost or status == "timeout":
            result.status = _worst(result.status, status)
            return False
    return True


def _run_from(kernel, notebook, start, never_replay, deadline, result):
    for index in range(start, len(notebook.cells)):
        cell = notebook.cells[index]
        if not _graded_code(cell):
            continue
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            result.status = _worst(result.status, "timeout")
            result.cells.append({"index": index, "kind": _kind(cell), "status": "skipped", "seconds": 0.0})
            continue
        begin = time.monotonic()
        status = kernel.run(cell, index, min(kernel.limits.cell_seconds, remaining))
        result.cells.append({"index": index, "kind": _kind(cell), "status": status,
                             "seconds": round(time.monotonic() - begin, 3)})
        if _kind(cell) == "answer" or status in ("timeout", "dead_kernel"):
            result.status = _worst(result.status, status)
        if kernel.lost:
            if _kind(cell) == "answer":
                never_replay.add(index)
            _note_lost_kernel(cell, kernel.lost)
            more = any(_graded_code(c) for c in notebook.cells[index + 1:])
            return index + 1 if more and time.monotonic() < deadline else None  # no new kernel for nothing left
    return None


def _graded_code(cell):
    """A cell the grader runs (check cells only print the public checks' report; the lab's cells after its last
    answer cannot change a mark: helpers.grading.prepare.assemble)."""
    return cell.cell_type == "code" and _kind(cell) not in ("check", "after")


_LOST = {"timeout": "it ran past its time limit and ignored the interrupt, so its kernel was killed",
         "disk": "it wrote files in (or changed) the directory of its kernel's sockets, on the grader's disk (write in "
                 "the working directory instead), so its kernel was killed",
         "died": "its kernel died", "message": "its kernel sent a message the grader could not read, so its kernel "
         "was killed", "tasks": "it hit the limit on processes and threads (a fork bomb?), so its kernel "
         "was killed", "memory": "its kernel and ranks together passed their memory limit, so its kernel was killed"}


def _note_lost_kernel(cell, lost):
    """Say in the executed notebook why the cell's output ends."""
    why = _LOST[lost]
    cell.outputs.append(nbformat.v4.new_output("stream", name="stderr",
                        text=f"[grader] {why}; a new kernel replayed the earlier cells and grading went on\n"))
