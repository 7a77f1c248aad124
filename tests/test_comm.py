"""helpers.comm: the ledger sees PyTorch's own collectives (DDP, FSDP2, ZeRO) and counts bytes exactly."""
import contextlib
import linecache
import pickle
import sys
import threading
import time

import cloudpickle
import pytest
import torch
import torch.distributed as dist
import torch.nn as nn

from helpers.comm import CommLedger, CommRecord, wire_bytes
from helpers.launch import launch

# Rank functions travel by value: by reference every rank would import this module, and pytest with it
# (0.16-0.2 CPU-s a rank, in every launch).
cloudpickle.register_pickle_by_value(sys.modules[__name__])

HANG_S = 30.0  # launch's hang watchdog; the pytest timeouts below leave room for it to report first


def _mlp():
    """psi = 1864 fp32 parameters; every dim 0 is divisible by 4, so FSDP2 shards need no padding at N=4."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 8))


PSI = (16 * 32 + 32) + (32 * 32 + 32) + (32 * 8 + 8)  # parameters of _mlp(): weights + biases


def _batch():
    """Different data on every rank."""
    g = torch.Generator().manual_seed(100 + dist.get_rank())
    return torch.randn(8, 16, generator=g)


def _line_of(call_site):
    """The source line a 'file:line in function' call site points at."""
    path, rest = call_site.rsplit(":", 1)
    return linecache.getline(path, int(rest.split(" in ")[0])).strip()


def test_wire_bytes_follow_the_ring_formulas_exactly():
    assert PSI == sum(p.numel() for p in _mlp().parameters()) == 1864
    psi = PSI
    for n in (1, 2, 3, 4):
        assert wire_bytes("all_reduce", 4 * psi, n) == 4 * psi * 2 * (n - 1) // n
        assert wire_bytes("all_gather", 4 * psi, n) == 4 * psi * (n - 1) // n
        assert wire_bytes("reduce_scatter", 4 * psi, n) == 4 * psi * (n - 1) // n
        assert wire_bytes("broadcast", 4 * psi, n) == 4 * psi * (n - 1) // n
        assert wire_bytes("send", 100, n) == 100
        assert wire_bytes("recv", 100, n) == 0
        assert wire_bytes("barrier", 0, n) == 0
    assert wire_bytes("all_reduce", 10, 3) == 13  # 40/3 rounds down: documented
    # N broadcasts of N shards cost one all-gather of the whole (ZeRO's accounting).
    assert 4 * wire_bytes("broadcast", 1000, 4) == wire_bytes("all_gather", 4000, 4)


def _ddp_step():
    from torch.nn.parallel import DistributedDataParallel as DDP

    with CommLedger() as init:
        model = DDP(_mlp())  # the constructor broadcasts rank 0's parameters
    with CommLedger() as step:
        model(_batch()).square().mean().backward()
    return init.totals(), init.records, step.totals(), step.records


@pytest.mark.timeout(90)
def test_ddp_step_all_reduces_4_psi_bytes_from_cpp():
    n = 4
    results = launch(_ddp_step, n, hang_timeout=HANG_S)
    for init_totals, init_records, totals, records in results:
        # Backward all-reduces every gradient exactly once (flat buckets, no padding), and nothing else.
        assert set(totals) == {"all_reduce"}
        assert totals["all_reduce"]["payload_bytes"] == 4 * PSI
        assert totals["all_reduce"]["wire_bytes"] * n == 4 * PSI * 2 * (n - 1)
        assert all(r.call_site is None for r in records)  # issued by DDP's C++ Reducer
        assert all(r.end is not None and r.end >= r.start for r in records)
        # The constructor's broadcast of the parameters is a separate, Python-called entry.
        params = [r for r in init_records if r.op == "broadcast" and r.dtype == "float32"]
        assert sum(r.payload_bytes for r in params) == 4 * PSI
        assert all("DDP(_mlp())" in _line_of(r.call_site) for r in params)
    assert all(r[2] == results[0][2] for r in results)


def _fsdp2_vs_ddp():
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.nn.parallel import DistributedDataParallel as DDP

    ddp = DDP(_mlp())
    with CommLedger() as ddp_ledger:
        ddp(_batch()).square().mean().backward()
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    params = []
    for use_ledger in (False, True):
        model = _mlp()
        for layer in model:
            if isinstance(layer, nn.Linear):
                fully_shard(layer, mesh=mesh, reshard_after_forward=True)
        fully_shard(model, mesh=mesh, reshard_after_forward=True)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        ledger = CommLedger() if use_ledger else contextlib.nullcontext()
        with ledger:
            model(_batch()).square().mean().backward()
            opt.step()
        params.append([p.to_local().clone() for p in model.parameters()])
    same = all(torch.equal(a, b) for a, b in zip(*params))
    return ddp_ledger.totals(), ledger.totals(), same


@pytest.mark.timeout(90)
def test_fsdp2_step_moves_one_and_a_half_times_ddp():
    n = 4
    for ddp, fsdp, same in launch(_fsdp2_vs_ddp, n, hang_timeout=HANG_S):
        assert same, "FSDP2 under the ledger must compute exactly what it computes without it"
        # All-gather in forward and again in backward (resharded after forward), reduce-scatter once.
        assert set(fsdp) == {"all_gather", "reduce_scatter"}
        assert fsdp["all_gather"]["payload_bytes"] == 2 * 4 * PSI
        assert fsdp["reduce_scatter"]["payload_bytes"] == 4 * PSI
        fsdp_wire = fsdp["all_gather"]["wire_bytes"] + fsdp["reduce_scatter"]["wire_bytes"]
        ratio = fsdp_wire / ddp["all_reduce"]["wire_bytes"]
        # 1.5 exactly here (no shard padding: every dim 0 divides by 4). Padding can only add
        # bytes, a few percent on small models, so the check allows 2 %.
        assert ratio == pytest.approx(1.5, rel=0.02)


def _zero_step():
    from torch.distributed.optim import ZeroRedundancyOptimizer

    model = _mlp()
    opt = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.SGD, lr=0.1)
    model(_batch()).square().mean().backward()
    with CommLedger() as ledger:
        opt.step()  # each rank updates the parameters it owns, then broadcasts them
    return ledger.totals(), ledger.records


@pytest.mark.timeout(90)
def test_zero_redundancy_optimizer_broadcasts_every_parameter_once():
    for totals, records in launch(_zero_step, 3, hang_timeout=HANG_S):
        assert set(totals) == {"broadcast"}
        assert totals["broadcast"]["payload_bytes"] == 4 * PSI
        assert all("opt.step()" in _line_of(r.call_site) for r in records)


def _python_calls():
    n, rank = dist.get_world_size(), dist.get_rank()
    x = torch.ones(6 * n)  # 4 * 6n bytes
    with CommLedger() as ledger:
        work = dist.all_reduce(x, async_op=True)
        work.wait()
        dist.all_gather_single(torch.empty(6 * n * n), x)
        dist.all_gather_into_tensor(torch.empty(6 * n * n), x)
        dist.reduce_scatter_single(torch.empty(6), x)
        dist.reduce_scatter_tensor(torch.empty(6), x)
        dist.all_gather([torch.empty(6 * n) for _ in range(n)], x)
        dist.broadcast(x, src=0)
        dist.reduce(x, dst=0)
        dist.all_to_all_single(torch.empty(6 * n), x)
        dist.barrier()
        if rank == 0 and n > 1:
            dist.send(x, dst=1)
        elif rank == 1:
            dist.recv(x, src=0)
    return ledger.records, ledger.totals()


@pytest.mark.timeout(90)
@pytest.mark.parametrize("n", [1, 2, 3])
def test_python_collectives_payload_and_wire_conventions(n):
    size = 4 * 6 * n  # bytes of the per-rank tensor x
    for rank, (records, totals) in enumerate(launch(_python_calls, n, hang_timeout=HANG_S)):
        first = records[0]
        assert first.op == "all_reduce" and first.c10d_op == "c10d::allreduce_"
        assert "dist.all_reduce(x, async_op=True)" in _line_of(first.call_site)
        assert first.end is not None and first.end >= first.start  # the async work's completion
        assert totals["all_reduce"] == {"calls": 1, "payload_bytes": size,
                                        "wire_bytes": size * 2 * (n - 1) // n}
        # all_gather counts its gathered OUTPUT, reduce_scatter its full INPUT: N x the per-rank piece.
        assert totals["all_gather"] == {"calls": 3, "payload_bytes": 3 * n * size,
                                        "wire_bytes": 3 * (n * size * (n - 1) // n)}
        assert totals["reduce_scatter"] == {"calls": 2, "payload_bytes": 2 * size,
                                            "wire_bytes": 2 * (size * (n - 1) // n)}
        assert totals["broadcast"]["payload_bytes"] == totals["reduce"]["payload_bytes"] == size
        assert totals["all_to_all"]["payload_bytes"] == size
        assert totals["barrier"] == {"calls": 1, "payload_bytes": 0, "wire_bytes": 0}
        assert all(r.group_size == n and r.dtype in ("float32", None) for r in records)
        if n > 1 and rank < 2:
            p2p = "send" if rank == 0 else "recv"
            assert totals[p2p] == {"calls": 1, "payload_bytes": size, "wire_bytes": size if rank == 0 else 0}


def _switch_off():
    x = torch.ones(4)
    with CommLedger() as ledger:
        dist.all_reduce(x)
        inside = torch._C._dispatch_has_kernel_for_dispatch_key("c10d::allreduce_", "BackendSelect")
    dist.all_reduce(x)  # after the block: not recorded
    try:
        with CommLedger() as failed:
            dist.all_reduce(x)
            raise ValueError("boom")
    except ValueError:
        pass
    dist.all_reduce(x)
    outside = torch._C._dispatch_has_kernel_for_dispatch_key("c10d::allreduce_", "BackendSelect")
    return len(ledger.records), len(failed.records), failed.totals(), inside, outside


@pytest.mark.timeout(90)
def test_ledger_is_off_after_exit_and_after_an_exception():
    for calls, failed_calls, failed_totals, inside, outside in launch(_switch_off, 2, hang_timeout=HANG_S):
        assert (calls, failed_calls) == (1, 1)
        assert failed_totals["all_reduce"]["calls"] == 1
        assert inside and not outside  # our kernel is registered only while a ledger is open


def _nested():
    x = torch.ones(4)
    with CommLedger() as outer:
        with outer.tag("bucket 0"):
            dist.all_reduce(x)
        with CommLedger() as inner:
            with inner.tag("bucket 1"):
                dist.all_reduce(x)
            try:
                with inner:
                    pass
            except RuntimeError as exc:
                reentry = str(exc)
        # Collectives from other threads and under inference_mode count too: the ledger is per process.
        thread = threading.Thread(target=dist.all_reduce, args=(torch.ones(2),))
        thread.start()
        thread.join()
        with torch.inference_mode():
            dist.all_reduce(torch.ones(3))
    return [(r.label, r.numel) for r in outer.records], [(r.label, r.numel) for r in inner.records], reentry


@pytest.mark.timeout(90)
def test_nested_ledgers_each_count_once_and_keep_their_labels():
    for outer, inner, reentry in launch(_nested, 2, hang_timeout=HANG_S):
        assert outer == [("bucket 0", 4), (None, 4), (None, 2), (None, 3)]
        assert inner == [("bucket 1", 4)]
        assert "already recording" in reentry


def _dtensor():
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    sharded = distribute_tensor(torch.ones(8, 4), mesh, [Shard(0)])
    with CommLedger() as ledger:
        sharded.redistribute(mesh, [Replicate()]).to_local()  # a functional all-gather inside DTensor
    return ledger.records


@pytest.mark.timeout(90)
def test_dtensor_functional_collectives_are_seen_once():
    for records in launch(_dtensor, 2, hang_timeout=HANG_S):
        assert [(r.op, r.payload_bytes) for r in records] == [("all_gather", 8 * 4 * 4)]
        assert "redistribute" in _line_of(records[0].call_site)


def test_records_and_totals_pickle_as_plain_data():
    ledger = CommLedger()
    with ledger:
        pass
    assert ledger.totals() == {}
    record = CommRecord(op="all_reduce", dtype="float32", numel=3, payload_bytes=12, wire_bytes=12,
                         group_size=2, call_site=None, start=1.0, end=2.0)
    assert pickle.loads(pickle.dumps(record)) == record
    assert record.as_dict()["wire_bytes"] == 12


def _many_bucket_steps():
    from torch.nn.parallel import DistributedDataParallel as DDP

    model = DDP(_mlp(), bucket_cap_mb=0.01)
    missing = 0
    for _ in range(20):
        with CommLedger() as ledger:
            model(_batch()).square().mean().backward()
        missing += sum(r.end is None for r in ledger.records if r.op == "all_reduce")
    return missing


@pytest.mark.timeout(90)
def test_finished_work_always_has_its_end_time_at_exit():
    # A future's waiters can wake before its callbacks ran; the ledger must wait for the stamp.
    assert launch(_many_bucket_steps, 2, hang_timeout=HANG_S) == [0, 0]


# --- CUDA collectives timed by CUDA events (issue 16, item 3): the branch run on a CPU with fake events ---

class FakeEvent:
    """A CUDA timing event whose GPU time is the host's perf_counter when recorded (milliseconds)."""

    log: list = []  # (event, name of the function that recorded it)

    def __init__(self, enable_timing=False):
        assert enable_timing
        self.ms = None

    def record(self, stream=None):
        assert stream == "stream of cuda:0"
        self.ms = time.perf_counter() * 1000.0
        FakeEvent.log.append((self, sys._getframe(2).f_code.co_name))  # caller of CudaClock.event

    def synchronize(self):
        assert self.ms is not None, "synchronize() on an event never recorded"

    def elapsed_time(self, end):
        return end.ms - self.ms


class FakeCuda:
    """The three torch.cuda names CudaClock uses."""

    Event = FakeEvent

    @staticmethod
    def synchronize(device):
        assert device == 0

    @staticmethod
    def current_stream(device):
        return f"stream of cuda:{device}"


def _fake_cuda_collectives():
    from helpers import comm

    comm._clock = comm.CudaClock(FakeCuda())
    comm._cuda_device = lambda tensors: 0  # take the CUDA branch with CPU tensors (Gloo does the work)
    t = torch.ones(1000)
    with CommLedger() as outer:
        dist.all_reduce(t)
        with CommLedger() as inner:
            work = dist.all_reduce(t, async_op=True)
            dist.broadcast(t, src=0)  # issued while the all-reduce may still run: same group, same stream
            work.wait()
            assert outer.records[1].end is None  # times come from events when a ledger exits
    # The inner ledger's exit resolved the first all-reduce too: its end bounds the next one's start.
    assert all(r.end is not None for r in outer.records)
    events = [(e.ms / 1000.0, who) for e, who in FakeEvent.log]
    return outer.records, inner.records, events


@pytest.mark.timeout(60)
def test_cuda_collectives_are_timed_by_events_recorded_after_the_work():
    outer, inner, events = launch(_fake_cuda_collectives, 1, hang_timeout=HANG_S)[0]
    # One anchor, then per collective a ready event (before the call) and an end event (Work callback).
    whos = [who for _, who in events]
    assert whos[0] == "anchor" and whos.count("kernel") == 3 and whos.count("record_end") == 3, whos
    ends = sorted(t for t, who in events if who == "record_end")
    assert len(ends) == 3 and len(outer) == 3 and [r.op for r in outer] == ["all_reduce", "all_reduce", "broadcast"]
    anchor_s = events[0][0]
    for r in outer:
        assert r.end is not None and r.start <= r.end
    # Each end is an end event's time, moved onto perf_counter by the anchor (within its sync gap).
    assert all(min(abs(r.end - e) for e in ends) < 0.05 for r in outer)
    # Same group, one NCCL stream: a collective starts no earlier than the previous one ended.
    assert outer[1].start >= outer[0].end and outer[2].start >= outer[1].end
    # Nested ledgers carry the same times; the device is recorded.
    assert [(r.start, r.end) for r in inner] == [(r.start, r.end) for r in outer[1:]]
    assert all(r.device == "cpu" for r in outer) and anchor_s <= outer[0].start + 0.05


def test_cuda_timings_on_one_stream_chain_without_recursion():
    from helpers import comm

    class Clock:  # seconds(event) is the event itself: a number
        def seconds(self, device, event):
            return event

    saved, comm._clock = comm._clock, Clock()
    try:
        previous, chain = None, []
        for i in range(5000):  # ready at i, ends at i + 2: each waits for the one before on its stream
            timing = comm._CudaTiming([CommRecord("all_reduce", "float32", 1, 4, 4, 2, None, 0.0)], 0, float(i),
                                      previous)
            timing.end_event = float(i + 2)
            chain.append(timing)
            previous = timing
        p2p = comm._CudaTiming([CommRecord("send", "float32", 1, 4, 4, 2, None, 0.0)], 0, 1.0, None)
        p2p.end_event = 1.5
        chain[-1].resolve()  # the newest first: resolves the whole chain, oldest first, iteratively
        p2p.resolve()
    finally:
        comm._clock = saved
    assert [(t.records[0].start, t.records[0].end) for t in chain[:2]] == [(0.0, 2.0), (2.0, 3.0)]
    assert p2p.records[0].start == 1.0 and p2p.records[0].end == 1.5
