"""Execute a graded notebook cell by cell in a fenced kernel, with a per-cell and a total time limit."""
import dataclasses
import math
import threading
import time

from nbclient import NotebookClient
from nbclient.exceptions import DeadKernelError

from helpers.grading.sandbox import kill_session, make_kernel_manager, working_directory


@dataclasses.dataclass
class Limits:
    """How much one submission may use."""

    cell_seconds: float = 60.0
    total_seconds: float = 300.0
    memory_bytes: int = 4 * 2**30
    isolate_network: bool = False
    drop_user: bool = False
    hidden_dirs: tuple = ()
    readonly_dirs: tuple = ()


@dataclasses.dataclass
class Execution:
    """What happened: overall status and one log row per cell."""

    status: str = "ok"  # ok | error | timeout | dead_kernel
    cells: list = dataclasses.field(default_factory=list)


def _cell_status(cell, seconds, limit):
    errors = [o for o in cell.get("outputs", []) if o.get("output_type") == "error"]
    if not errors:
        return "ok"
    # Our interrupt at the time limit reaches the cell as KeyboardInterrupt.
    if errors[0].get("ename") == "KeyboardInterrupt" and seconds >= limit - 0.5:
        return "timeout"
    return "error"


def _worst(a, b):
    order = ["ok", "error", "timeout", "dead_kernel"]
    return max(a, b, key=order.index)


def execute(notebook, workdir, limits):
    """Run every cell; never raises for what the notebook does. Returns an Execution."""
    km = make_kernel_manager(workdir, limits.memory_bytes, isolate_network=limits.isolate_network,
                             drop_user=limits.drop_user, hidden_dirs=limits.hidden_dirs,
                             readonly_dirs=limits.readonly_dirs)
    client = NotebookClient(notebook, km=km, timeout=int(limits.cell_seconds), allow_errors=True,
                            interrupt_on_timeout=True, startup_timeout=60,
                            resources={"metadata": {"path": working_directory(workdir)}})
    result = Execution()
    # The per-cell interrupt fails against code that ignores SIGINT: the wall clock kills the session.
    killer = threading.Timer(limits.total_seconds + 5.0, kill_session, args=(km,))
    deadline = math.inf
    try:
        with client.setup_kernel():
            # The clock starts once the kernel is up: a slow start on a loaded host is not the student's.
            deadline = time.monotonic() + limits.total_seconds
            killer.start()
            _run_cells(client, notebook, deadline, limits, result)
    except DeadKernelError:
        result.status = _worst(result.status, "timeout" if time.monotonic() >= deadline else "dead_kernel")
    except RuntimeError as exc:  # the kernel did not even start
        result.status = "dead_kernel"
        result.cells.append({"index": -1, "kind": "kernel", "status": "dead_kernel", "seconds": 0.0,
                             "error": str(exc)})
    finally:
        killer.cancel()
        kill_session(km)
    return result


def _run_cells(client, notebook, deadline, limits, result):
    for index, cell in enumerate(notebook.cells):
        if cell.cell_type != "code" or cell.metadata.get("dp_course_kind") == "check":
            continue
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            result.status = _worst(result.status, "timeout")
            result.cells.append({"index": index, "kind": cell.metadata.get("dp_course_kind"),
                                 "status": "skipped", "seconds": 0.0})
            continue
        # nbclient takes whole seconds; round up so the last cell runs until the deadline, not short of it.
        client.timeout = max(1, math.ceil(min(limits.cell_seconds, remaining)))
        start = time.monotonic()
        try:
            client.execute_cell(cell, index)
        finally:
            seconds = time.monotonic() - start
            status = _cell_status(cell, seconds, client.timeout)
            result.cells.append({"index": index, "kind": cell.metadata.get("dp_course_kind"),
                                 "status": status, "seconds": round(seconds, 3)})
        if cell.metadata.get("dp_course_kind") == "answer" or status == "timeout":
            result.status = _worst(result.status, status)
