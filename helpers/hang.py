"""Where a blocked rank is: the collective it waits in and the user line that called it."""
import linecache
import os

import torch

_TORCH_DIR = os.path.dirname(torch.__file__)
_HELPERS_DIR = os.path.dirname(__file__)
_STDLIB_DIR = os.path.dirname(os.__file__)

# torch.distributed functions a rank can block in, by the name a learner knows them by.
COLLECTIVES = {
    "all_reduce", "all_gather", "all_gather_into_tensor", "all_gather_single", "all_gather_object",
    "reduce_scatter", "reduce_scatter_tensor", "reduce_scatter_single", "broadcast",
    "broadcast_object_list", "reduce", "gather", "scatter", "all_to_all", "all_to_all_single",
    "barrier", "monitored_barrier", "send", "recv", "isend", "irecv", "batch_isend_irecv",
    "init_process_group", "new_group", "destroy_process_group",
}


def is_user_file(filename):
    """True for code the learner wrote (a notebook cell, a script), not torch, helpers or stdlib."""
    if filename.startswith("<frozen"):
        return False
    return not filename.startswith((_TORCH_DIR, _HELPERS_DIR, _STDLIB_DIR))


def describe_main_thread(frame):
    """The innermost collective on the stack and the innermost user frame, as plain data."""
    op, site = None, None
    while frame is not None:
        code = frame.f_code
        if op is None and code.co_filename.startswith(_TORCH_DIR):
            if code.co_name in COLLECTIVES:
                op = code.co_name
            elif code.co_name in ("backward", "_engine_run_backward"):
                op = "backward (gradient hooks, e.g. DDP's bucket all_reduce)"
            elif code.co_name == "wait":
                op = "wait on an async work handle"
        if site is None and is_user_file(code.co_filename):
            site = (code.co_filename, frame.f_lineno, code.co_name)
        if op and site:
            break
        frame = frame.f_back
    return {"op": op, "site": site}


def source_line(filename, lineno):
    """The source of a line, from the kernel's cache (notebook cells live only there)."""
    return linecache.getline(filename, lineno).strip()


def describe_file(filename):
    """'In [7]' for a notebook cell the kernel ran, else the file's base name."""
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
    """'In [7] line 4 in train: dist.barrier()' for a (filename, lineno, function) triple."""
    if not site:
        return "no user code on the stack"
    filename, lineno, name = site
    where = f"{describe_file(filename)} line {lineno}"
    line = source_line(filename, lineno)
    return f"{where} in {name}: {line}" if line else f"{where} in {name}"


def describe_rank(report):
    """One line per rank for a CollectiveHang message."""
    rank, seq = report["rank"], report.get("seq", -1)
    if report.get("phase") == "finished":
        return f"rank {rank}: finished its function after {seq} collective(s), waiting for the others"
    if report.get("phase") == "gone":
        return f"rank {rank}: no answer (process gone)"
    if report.get("phase") == "rendezvous":
        return f"rank {rank}: still joining the process group (init_process_group)"
    op = report.get("op") or "no collective (computing or sleeping?)"
    # The backend counts a collective when it is issued, so a blocked one is already counted.
    return f"rank {rank}: blocked in {op} #{seq}, called at {describe_site(report.get('site'))}"


def hang_hint(reports):
    """What to look for, given where the ranks are blocked."""
    ops = {r.get("op") for r in reports if r.get("phase") == "running"}
    if ops and ops <= {"send", "recv"} and len(ops) == 1:
        return ("Every rank waits in the same point-to-point op: a blocking send waits for its recv. "
                "Pair them (even ranks send first, odd ranks receive first) or use isend/irecv.")
    return ("Every rank must call the same collectives in the same order; look for a rank that "
            "skipped one or called a different one.")
