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

Times (time.perf_counter() seconds), by the device of the collective's tensors:
    CPU tensors (Gloo)   start: just before the backend is called. end: when the Work's future
                         completes, i.e. the collective finished. Gloo's reduce-scatter (completed
                         inside wait()) and send/recv have no future: their end stays None.
    CUDA tensors (NCCL)  The host only enqueues the work, so host clocks would time the enqueue. The
                         times come from CUDA events instead (class CudaClock), resolved when the
                         ledger exits (which waits for its collectives to finish on the GPU):
                         ready: an event on the current stream before the call (NCCL's stream waits
                           for this point: the inputs are computed);
                         end: an event recorded in a callback of the Work's future, which torch runs
                           with current streams that wait for the collective's kernels
                           (torch/futures/__init__.py, Future.then), so it completes when the bytes
                           have moved;
                         start = max(ready, end of the previous collective on the same group):
                           ProcessGroupNCCL runs one group's collectives in order on one stream.
                         Point-to-point ops (own NCCL streams) get start = ready.
                         The GPU clock is tied to perf_counter by an anchor event recorded on an idle
                         device (one torch.cuda.synchronize at the first CUDA record, or at entry when
                         CUDA is already initialised); error: tens of microseconds.
tests/test_comm.py runs the CUDA branch on a CPU with fake events (the arithmetic and the callback
wiring); only `make gpu-check` runs it with real CUDA events.

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

__all__ = ["CommLedger", "CommRecord", "CudaClock", "wire_bytes"]

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

_P2P = {"send", "recv"}
# Frames of the ledger and of the device guard (a TorchFunctionMode that sees dist.all_reduce) are not call sites.
_OWN_FILES = {__file__, os.path.join(os.path.dirname(__file__), "launcher", "device_guard.py")}
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
    device: str | None = None  # "cpu", "cuda:1": where the collective's tensors were

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
    while frame is not None and frame.f_code.co_filename in _OWN_FILES:
        frame = frame.f_back
    # Backward's entry frame is the caller only when a C++ autograd hook (DDP's Reducer) issued it.
    if frame is None or frame.f_code.co_filename.startswith(_AUTOGRAD_DIR):
        return None
    while frame is not None and (frame.f_code.co_filename.startswith(_TORCH_DIR)
                                 or frame.f_code.co_filename in _OWN_FILES):
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
        start=0.0, c10d_op=op_name, device=str(tensors[0].device) if tensors else None)


def _cuda_device(tensors: list) -> int | None:
    """Index of the CUDA device a collective's tensors are on; None for CPU tensors."""
    return next((t.device.index for t in tensors if t.is_cuda), None)


class CudaClock:
    """GPU time as time.perf_counter() seconds, from CUDA timing events (module docstring, Times)."""

    def __init__(self, cuda=torch.cuda):
        self.cuda = cuda  # torch.cuda; tests pass a fake with Event, current_stream and synchronize
        self.anchors: dict = {}  # device index -> (event recorded on an idle device, its perf_counter time)

    def anchor(self, device: int) -> None:
        """Tie the device's clock to perf_counter once: record an event on an idle device, wait for it."""
        if device in self.anchors:
            return
        self.cuda.synchronize(device)
        event = self.event(device)
        event.synchronize()
        self.anchors[device] = (event, time.perf_counter())

    def event(self, device: int):
        """A timing event recorded now on the device's current stream."""
        event = self.cuda.Event(enable_timing=True)
        event.record(self.cuda.current_stream(device))
        return event

    def seconds(self, device: int, event) -> float:
        """perf_counter time at which a recorded event completed (waits until it has)."""
        anchor, at = self.anchors[device]
        event.synchronize()
        return at + anchor.elapsed_time(event) / 1000.0


_clock = CudaClock()


_last_on_stream: dict = {}  # (group name, device) -> its latest _CudaTiming: NCCL's stream for that group


class _CudaTiming:
    """One CUDA collective's events, turned into its records' start and end when a ledger exits."""

    def __init__(self, records: list, device: int, ready, previous):
        self.records, self.device, self.ready = records, device, ready
        self.previous = previous  # the collective issued before it on the same NCCL stream (None: p2p, first)
        self.end_event = None  # set by the Work future's callback; None when the work has no future
        self.start = self.end = None
        self.resolved = False

    def resolve(self) -> None:
        """Stamp start and end, after every unresolved collective before it on its stream."""
        chain = [self]
        while chain[-1].previous is not None and not chain[-1].previous.resolved:
            chain.append(chain[-1].previous)
        for timing in reversed(chain):  # oldest first; iterative, however long the chain
            timing._stamp()

    def _stamp(self) -> None:
        if self.resolved:
            return
        start = _clock.seconds(self.device, self.ready)
        if self.previous is not None and self.previous.end is not None:
            start = max(start, self.previous.end)  # the stream was busy with the previous collective
        self.previous = None  # resolved: let the chain be freed
        self.start = start
        end = _clock.seconds(self.device, self.end_event) if self.end_event is not None else None
        # A stream runs its collectives in order, so none ends before it starts; the end event is recorded
        # by the Work's callback, and callbacks of two works may run out of order (seen on CI with Gloo).
        self.end = None if end is None else max(end, start)
        for r in self.records:
            r.start, r.end = self.start, self.end
        self.resolved = True


def _cuda_timing(records: list, device: int, ready, args: tuple, op: str) -> _CudaTiming:
    """A timing for a CUDA collective just enqueued, chained to the previous one on its stream."""
    if op in _P2P:  # ProcessGroupNCCL runs point-to-point ops on streams of their own
        return _CudaTiming(records, device, ready, None)
    group = next(a for a in args if isinstance(a, torch.ScriptObject))
    key = (torch._C._distributed_c10d.ProcessGroup.unbox(group).group_name, device)
    timing = _CudaTiming(records, device, ready, _last_on_stream.get(key))
    _last_on_stream[key] = timing
    return timing


def _set_end(records: list) -> None:
    """Stamp the end time (a Work future's callback, run on the backend's thread)."""
    now = time.perf_counter()
    for r in records:
        r.end = now


def _work_future(out):
    """The Work's future among a c10d op's outputs; None when the backend gives none."""
    work = out[-1] if isinstance(out, tuple) else out
    try:
        return torch._C._distributed_c10d.Work.unbox(work).get_future()
    except RuntimeError:
        return None  # Gloo's reduce-scatter (completes inside wait()) and send/recv have none


def _watch(records: list, out):
    """Set the records' end time when the work completes; return (work future, callback future)."""
    future = _work_future(out)
    if future is None:
        return None
    return future, future.then(lambda _future: _set_end(records))


def _watch_cuda(timing: _CudaTiming, out):
    """Record the end event in the future's callback, where current streams wait for the collective."""
    future = _work_future(out)
    if future is None:
        return None

    def record_end(_future):
        timing.end_event = _clock.event(timing.device)

    return future, future.then(record_end)


def _kernel(op, spec):
    """The BackendSelect kernel for one c10d op: record, then hand on to the real kernel."""
    below = torch._C._dispatch_keyset_full_after(torch._C.DispatchKey.BackendSelect)
    name = op._schema.name  # "c10d::allreduce_"

    def kernel(keyset, *args, **kwargs):
        ledgers = list(_active)
        if not ledgers or getattr(_local, "inside", False):
            return op.redispatch(keyset & below, *args, **kwargs)
        record = _make_record(name, spec, args)
        tensors = _tensors(args)
        for ledger in ledgers:
            if ledger._check is not None:  # the device guard, the collective check (helpers/) may refuse the call
                ledger._check(record, tensors, args)
        ledgers = [ledger for ledger in ledgers if ledger._keep_records]
        device = _cuda_device(tensors) if ledgers else None
        if device is not None:
            _clock.anchor(device)  # a no-op after the first CUDA collective of the process
            ready = _clock.event(device)
        _local.inside = True  # a c10d kernel that called another c10d op must not count twice
        try:
            start = time.perf_counter()
            out = op.redispatch(keyset & below, *args, **kwargs)
        finally:
            _local.inside = False
        if not ledgers:  # only checks were open
            return out
        # One copy per open ledger: nested ledgers each count the call once, with their own label.
        records = [dataclasses.replace(record, start=start, label=ledger._label) for ledger in ledgers]
        for ledger, r in zip(ledgers, records):
            ledger.records.append(r)
        if device is None:
            watched = _watch(records, out)
        else:
            timing = _cuda_timing(records, device, ready, args, record.op)
            watched = _watch_cuda(timing, out)
            for ledger in ledgers:
                ledger._cuda.append(timing)
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

    def __init__(self, check=None, keep_records=True):
        self.records: list[CommRecord] = []
        self._keep_records = keep_records  # False: a ledger that only checks (its records would grow without end)
        self._label: str | None = None
        self._pending: list = []  # (work future, end-stamping callback future)
        self._cuda: list[_CudaTiming] = []  # CUDA collectives, timed when the ledger exits
        # check(record, tensors, args) runs before every collective and may raise to refuse it; args are the c10d op's.
        self._check = check

    def __enter__(self) -> CommLedger:
        if self in _active:
            raise RuntimeError("this CommLedger is already recording; nest a new CommLedger() instead")
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            _clock.anchor(torch.cuda.current_device())  # now, not in the middle of the first collective
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
        for timing in self._cuda:  # in the order the collectives were issued
            timing.resolve()
        self._cuda.clear()
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
