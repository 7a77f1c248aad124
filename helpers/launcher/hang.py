"""Where a blocked rank is: the collective it waits in and the user line that called it.

A diagnostic tool: it reads the stacks of running threads (sys._current_frames), which is its job.
"""
import linecache
import os

import torch
import torch.distributed as dist

from helpers.launcher import PACKAGE_DIR

_TORCH_DIR = os.path.dirname(torch.__file__)
_HELPERS_DIR = PACKAGE_DIR
_STDLIB_DIR = os.path.dirname(os.__file__)

# torch.distributed functions a rank can block in, by the name a learner knows them by.
COLLECTIVES = {
    "all_reduce", "all_gather", "all_gather_into_tensor", "all_gather_single", "all_gather_object",
    "reduce_scatter", "reduce_scatter_tensor", "reduce_scatter_single", "broadcast",
    "broadcast_object_list", "reduce", "gather", "scatter", "all_to_all", "all_to_all_single",
    "barrier", "monitored_barrier", "send", "recv", "isend", "irecv", "batch_isend_irecv",
    "init_process_group", "new_group", "destroy_process_group",
}
# Of those, the ones that complete only when every rank of the group joins them. Point-to-point ops pair two
# ranks, monitored_barrier has a timeout of its own, and group management is not a numbered collective.
NEEDS_EVERY_RANK = COLLECTIVES - {
    "send", "recv", "isend", "irecv", "batch_isend_irecv", "monitored_barrier",
    "init_process_group", "new_group", "destroy_process_group",
}

# A rank blocked in autograd: DDP's (or a hand-written Reducer's) gradient hooks issue all-reduces during the
# backward, and the backward waits for them before it returns.
BACKWARD = "backward (gradient hooks, e.g. DDP's bucket all_reduce)"
# A rank blocked in DDP's forward: after the first step it broadcasts the new bucket order, and with
# broadcast_buffers the buffers, before it computes anything.
DDP_FORWARD = "DDP's forward (its broadcast of the bucket order or of the buffers)"
_DDP_FILE = os.path.join(_TORCH_DIR, "nn", "parallel", "distributed.py")
_DDP_FORWARD_STEPS = ("_pre_forward", "_check_and_sync_module_buffers", "_sync_buffers")

# Notebook cells the kernel knows by another name: {filename: "In [7]"} (the %%ranks magic registers its cells).
_CELL_NAMES = {}


def is_user_file(filename):
    """True for code the learner wrote (a notebook cell, a script), not torch, helpers or stdlib."""
    if filename.startswith("<frozen"):
        return False
    return not filename.startswith((_TORCH_DIR, _HELPERS_DIR, _STDLIB_DIR))


def _on_default_group(frame):
    """Whether the collective running in frame uses the default group (the group every rank is in)."""
    group = frame.f_locals.get("group")
    if group is None:
        return True
    try:
        return group is dist.distributed_c10d._get_default_group()
    except (RuntimeError, ValueError):  # no default group (any more)
        return False


def describe_main_thread(frame):
    """The innermost collective on the stack and the innermost user frame, as plain data."""
    op, site, world = None, None, False
    while frame is not None:
        code = frame.f_code
        if op is None and code.co_filename.startswith(_TORCH_DIR):
            if code.co_name in COLLECTIVES:
                op = code.co_name
                world = _on_default_group(frame)
            elif code.co_name in ("backward", "_engine_run_backward"):
                op = BACKWARD
            elif code.co_filename == _DDP_FILE and code.co_name in _DDP_FORWARD_STEPS:
                op = DDP_FORWARD
            elif code.co_name == "wait":
                op = "wait on an async work handle"
        if site is None and is_user_file(code.co_filename):
            site = (code.co_filename, frame.f_lineno, code.co_name)
        if op and site:
            break
        frame = frame.f_back
    return {"op": op, "site": site, "world": world}


def source_line(filename, lineno):
    """The source of a line, from the kernel's cache (notebook cells live only there)."""
    return linecache.getline(filename, lineno).strip()


def name_cell(filename, label):
    """Show filename as label ('In [7]') in reports: a cell the kernel compiled under a name of ours."""
    _CELL_NAMES[filename] = label


def describe_file(filename):
    """'In [7]' for a notebook cell the kernel ran, else the file's base name."""
    if filename in _CELL_NAMES:
        return _CELL_NAMES[filename]
    try:
        from IPython import get_ipython
    except ImportError:
        get_ipython = None
    shell = get_ipython() if get_ipython else None
    # IPython names each cell's code after a hash of its source and remembers its execution count.
    number = getattr(getattr(shell, "compile", None), "_filename_map", {}).get(filename)
    if number is not None:
        return f"In [{number}]"
    return os.path.basename(filename)


def describe_site(site):
    """'In [7], line 4, in train: dist.barrier()' for a (filename, lineno, function) triple.

    IPython's own form ('Cell In[7], line 4'), so a report and a traceback point at a line the same way.
    """
    if not site:
        return "no user code on the stack"
    filename, lineno, name = site
    where = f"{describe_file(filename)}, line {lineno}"
    line = source_line(filename, lineno)
    name = "" if name == "<module>" else f", in {name}"
    return f"{where}{name}: {line}" if line else f"{where}{name}"


def describe_rank(report):
    """One line per rank for a CollectiveHang message."""
    rank, seq = report["rank"], report.get("seq", -1)
    if report.get("phase") == "finished":
        return f"rank {rank}: finished its function after {seq} collective(s), waiting for the others"
    if report.get("phase") == "gone":
        return f"rank {rank}: no answer (process gone)"
    if report.get("phase") == "unreported":
        return f"rank {rank}: still running (no report from it yet)"
    if report.get("phase") == "rendezvous":
        return f"rank {rank}: still joining the process group (init_process_group)"
    op = report.get("op") or "no collective (computing or sleeping?)"
    # The backend counts a collective when it is issued, so a blocked one is already counted.
    return f"rank {rank}: blocked in {op} #{seq}, called at {describe_site(report.get('site'))}"


def certain_deadlock(reports, finished):
    """The running ranks blocked in a collective that a finished rank will never join ([] if none).

    finished: {rank: collectives it issued before returning}. A collective on the default group numbered past
    that count needs the finished rank too, so it cannot complete; only the process-group timeout would end it.
    A rank blocked in a backward has issued that collective from a gradient hook (seq counts the default group
    only) and its backward waits for it; one blocked in DDP's forward waits for the broadcast it issued: the same
    dead end, although their frames cannot name the group.
    """
    if not finished:
        return []
    fewest = min(finished.values())
    return [r for r in reports if r.get("phase") == "running" and r.get("seq", -1) > fewest >= 0
            and (r.get("op") in NEEDS_EVERY_RANK and r.get("world") or r.get("op") in (BACKWARD, DDP_FORWARD))]


def _ranks_text(ranks):
    ranks = sorted(ranks)
    return f"rank {ranks[0]}" if len(ranks) == 1 else "ranks " + ", ".join(map(str, ranks[:-1])) + f" and {ranks[-1]}"


def deadlock_summary(finished, blocked):
    """The first line of a certain deadlock's report: who returned early, who waits in what."""
    rank = min(finished, key=finished.get)
    first = min(blocked, key=lambda r: r["seq"])
    waiting = _ranks_text(r["rank"] for r in blocked)
    verb = "waits" if len(blocked) == 1 else "wait"
    return (f"deadlock: rank {rank} returned from its function after {finished[rank]} collective(s), while "
            f"{waiting} {verb} in {first['op']} #{first['seq']}, which rank {rank} will never join.")


DEADLOCK_HINT = ("A rank issued fewer collectives than the others: look for a collective inside an `if` or in a "
                 "loop whose length differs between ranks (a parameter whose .grad is None on one rank, a "
                 "shorter shard of the data).")


def hang_hint(reports):
    """What to look for, given where the ranks are blocked."""
    ops = {r.get("op") for r in reports if r.get("phase") == "running"}
    if ops and ops <= {"send", "recv"} and len(ops) == 1:
        return ("Every rank waits in the same point-to-point op: a blocking send waits for its recv. "
                "Pair them (even ranks send first, odd ranks receive first) or use isend/irecv.")
    return ("Every rank must call the same collectives in the same order; look for a rank that "
            "skipped one or called a different one.")
