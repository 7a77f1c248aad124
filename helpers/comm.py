"""A ledger of the collectives a rank issues: op, bytes, wire bytes, call site, start and end times.

    with CommLedger() as ledger:
        loss.backward()                     # DDP's reducer all-reduces from C++: recorded too
    ledger.totals()["all_reduce"]           # {"calls": 1, "payload_bytes": ..., "wire_bytes": ...}

Mechanism. Every ProcessGroup collective, whoever issues it (Python, DDP's C++ Reducer, FSDP2,
ZeroRedundancyOptimizer, DTensor's functional collectives, dist._broadcast_coalesced), passes the
dispatcher as an op in the `c10d` namespace (c10d::allreduce_, c10d::_allgather_base_, ...). While a
ledger is open we register a Python kernel for those ops only, at the BackendSelect key (present
for every call, even under inference_mode); it records the call and hands it on to the real kernel.
Other ops never reach Python. A TorchDispatchMode sees the same ops but intercepts every aten op:
on a 3-layer MLP step it measured 1.9x to 2.8x slower, which would distort compute-vs-comm timelines.
Consequence: while open, a ledger records the collectives of every thread of the process.

Times: start is taken just before the backend is called; end when the Work's future completes
(Gloo: the collective finished; NCCL: the work was enqueued on the GPU stream). Gloo's
reduce-scatter (completed inside wait()) and send/recv have no future: their end stays None.

Byte conventions (exact integers, rounded down; N = group size; payload = the logical tensor):
    op              payload_bytes                      wire_bytes (bytes this rank sends)
    all_reduce      the tensor                         2(N-1)/N payload   (ring: reduce-scatter + all-gather)
    all_gather      the gathered OUTPUT, N x input     (N-1)/N payload    (ring)
    reduce_scatter  the full INPUT, N x output         (N-1)/N payload    (ring)
    all_to_all      the input                          (N-1)/N payload    (equal splits assumed)
    broadcast       the tensor                         (N-1)/N payload    (this rank's share, see below)
    reduce          the tensor                         (N-1)/N payload    (this rank's share)
    gather/scatter  N x one rank's block               (N-1)/N^2 payload  (this rank's share)
    send            the tensor                         payload
    recv            the tensor                         0
    barrier         0                                  0
Rooted ops (broadcast, reduce, gather, scatter) do not load ranks evenly, and which rank sends what
depends on the algorithm. We report every rank's equal share of the least total traffic (broadcast:
each of the N-1 other ranks receives the tensor once, as in a pipelined chain), so N broadcasts of
N shards add up to exactly one all-gather, as ZeRO's accounting assumes.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import sys
import threading
import time

import torch

__all__ = ["CommLedger", "CommRecord", "wire_bytes"]

# c10d op -> (ledger op, index of the argument holding the logical tensor(s), times N?).
# gather_/scatter_ hold the full list only on the root, so every rank counts N x its own block.
_C10D_OPS = {
    "allreduce_": ("all_reduce", 0, False),
    "allreduce_coalesced_": ("all_reduce", 0, False),
    "allgather_": ("all_gather", 0, False),
    "_allgather_base_": ("all_gather", 0, False),
    "allgather_coalesced_": ("all_gather", 0, False),
    "allgather_into_tensor_coalesced_": ("all_gather", 0, False),
    "reduce_scatter_": ("reduce_scatter", 1, False),
    "_reduce_scatter_base_": ("reduce_scatter", 1, False),
    "reduce_scatter_tensor_coalesced_": ("reduce_scatter", 1, False),
    "broadcast_": ("broadcast", 0, False),
    "reduce_": ("reduce", 0, False),
    "gather_": ("gather", 1, True),
    "scatter_": ("scatter", 0, True),
    "alltoall_": ("all_to_all", 1, False),
    "alltoall_base_": ("all_to_all", 1, False),
    "send": ("send", 0, False),
    "recv_": ("recv", 0, False),
    "recv_any_source_": ("recv", 0, False),
    "barrier": ("barrier", None, False),
    "monitored_barrier_": ("barrier", None, False),
}

_TORCH_DIR = os.path.dirname(torch.__file__) + os.sep
_AUTOGRAD_DIR = os.path.join(_TORCH_DIR, "autograd") + os.sep

_active: list[CommLedger] = []  # open ledgers, outermost first; each gets every record
_libraries: list = []  # our kernel registrations, present exactly while _active is not empty
_local = threading.local()  # .inside: a recorded op is running on this thread (skip nested ops)


def wire_bytes(op: str, payload_bytes: int, group_size: int) -> int:
    """Bytes one rank sends for `op` on `payload_bytes` over `group_size` ranks (module docstring table)."""
    n = group_size
    if op == "all_reduce":
        return payload_bytes * 2 * (n - 1) // n
    if op in ("all_gather", "reduce_scatter", "all_to_all", "broadcast", "reduce"):
        return payload_bytes * (n - 1) // n
    if op in ("gather", "scatter"):
        return payload_bytes * (n - 1) // (n * n)
    if op == "send":
        return payload_bytes
    return 0  # recv, barrier


@dataclasses.dataclass
class CommRecord:
    """One collective as this rank issued it; times are time.perf_counter() seconds."""

    op: str
    dtype: str | None
    numel: int
    payload_bytes: int
    wire_bytes: int
    group_size: int
    call_site: str | None  # "file:line in function"; None when C++ issued it (DDP's reducer)
    start: float
    end: float | None = None  # None while running, or when the backend gives no completion signal
    label: str | None = None
    c10d_op: str = ""

    def as_dict(self) -> dict:
        """The record as a plain dict."""
        return dataclasses.asdict(self)


def _tensors(x) -> list:
    """The tensors in a tensor or a nested list of tensors."""
    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, (list, tuple)):
        return [t for item in x for t in _tensors(item)]
    return []


def _group_size(args) -> int:
    """Size of the ProcessGroup among a c10d op's arguments (it comes first among the ScriptObjects)."""
    group = next(a for a in args if isinstance(a, torch.ScriptObject))
    return torch._C._distributed_c10d.ProcessGroup.unbox(group).size()


def _call_site() -> str | None:
    """'file:line in function' of the innermost frame outside torch; None when C++ issued the call."""
    frame = sys._getframe(1)
    while frame is not None and frame.f_code.co_filename == __file__:
        frame = frame.f_back
    # Backward's entry frame is the caller only when a C++ autograd hook (DDP's Reducer) issued it.
    if frame is None or frame.f_code.co_filename.startswith(_AUTOGRAD_DIR):
        return None
    while frame is not None and frame.f_code.co_filename.startswith(_TORCH_DIR):
        frame = frame.f_back
    if frame is None:
        return None
    return f"{frame.f_code.co_filename}:{frame.f_lineno} in {frame.f_code.co_name}"


def _make_record(op_name: str, spec: tuple, args: tuple) -> CommRecord:
    """Describe one call of a c10d op (all but its times and label)."""
    op, index, times_n = spec
    n = _group_size(args)
    tensors = _tensors(args[index]) if index is not None else []
    scale = n if times_n else 1
    payload = sum(t.numel() * t.element_size() for t in tensors) * scale
    return CommRecord(
        op=op, dtype=str(tensors[0].dtype).removeprefix("torch.") if tensors else None,
        numel=sum(t.numel() for t in tensors) * scale, payload_bytes=payload,
        wire_bytes=wire_bytes(op, payload, n), group_size=n, call_site=_call_site(),
        start=0.0, c10d_op=op_name)


def _set_end(records: list) -> None:
    """Stamp the end time (a Work future's callback, run on the backend's thread)."""
    now = time.perf_counter()
    for r in records:
        r.end = now


def _watch(records: list, out):
    """Set the records' end time when the work completes; return (work future, callback future)."""
    work = out[-1] if isinstance(out, tuple) else out
    try:
        future = torch._C._distributed_c10d.Work.unbox(work).get_future()
    except RuntimeError:
        return None  # Gloo's reduce-scatter (completes inside wait()) and send/recv have none
    return future, future.then(lambda _future: _set_end(records))


def _kernel(op, spec):
    """The BackendSelect kernel for one c10d op: record, then hand on to the real kernel."""
    below = torch._C._dispatch_keyset_full_after(torch._C.DispatchKey.BackendSelect)
    name = op._schema.name  # "c10d::allreduce_"

    def kernel(keyset, *args, **kwargs):
        ledgers = list(_active)
        if not ledgers or getattr(_local, "inside", False):
            return op.redispatch(keyset & below, *args, **kwargs)
        record = _make_record(name, spec, args)
        _local.inside = True  # a c10d kernel that called another c10d op must not count twice
        try:
            start = time.perf_counter()
            out = op.redispatch(keyset & below, *args, **kwargs)
        finally:
            _local.inside = False
        # One copy per open ledger: nested ledgers each count the call once, with their own label.
        records = [dataclasses.replace(record, start=start, label=ledger._label) for ledger in ledgers]
        for ledger, r in zip(ledgers, records):
            ledger.records.append(r)
        watched = _watch(records, out)
        if watched:
            for ledger in ledgers:
                ledger._pending.append(watched)
        return out

    return kernel


def _install() -> None:
    """Register our kernel for every c10d collective op."""
    library = torch.library.Library("c10d", "IMPL")
    for name, spec in _C10D_OPS.items():
        packet = getattr(torch.ops.c10d, name, None)
        if packet is not None:
            library.impl(name, _kernel(packet.default, spec), "BackendSelect", with_keyset=True)
    _libraries.append(library)


def _uninstall() -> None:
    """Remove our kernels: the dispatcher is exactly as before."""
    while _libraries:
        _libraries.pop()._destroy()


class CommLedger:
    """Context manager recording every collective this process issues, PyTorch's own included."""

    def __init__(self):
        self.records: list[CommRecord] = []
        self._label: str | None = None
        self._pending: list = []  # (work future, end-stamping callback future)

    def __enter__(self) -> CommLedger:
        if self in _active:
            raise RuntimeError("this CommLedger is already recording; nest a new CommLedger() instead")
        if not _active:
            _install()
        _active.append(self)
        return self

    def __exit__(self, *exc) -> bool:
        # A waiter wakes when a future completes, possibly before its callbacks ran: for finished
        # work, wait for the end-stamping callback too, so that every finished record has its end.
        for future, stamped in self._pending:
            if future.done():
                stamped.wait()
        self._pending.clear()
        _active.remove(self)
        if not _active:
            _uninstall()
        return False

    @contextlib.contextmanager
    def tag(self, label: str):
        """Label the records of collectives issued inside the block, e.g. ledger.tag("bucket 3")."""
        outer, self._label = self._label, label
        try:
            yield self
        finally:
            self._label = outer

    def totals(self) -> dict:
        """{op: {"calls", "payload_bytes", "wire_bytes"}} over all records, as plain picklable dicts."""
        out = {}
        for r in self.records:
            t = out.setdefault(r.op, {"calls": 0, "payload_bytes": 0, "wire_bytes": 0})
            t["calls"] += 1
            t["payload_bytes"] += r.payload_bytes
            t["wire_bytes"] += r.wire_bytes
        return out
