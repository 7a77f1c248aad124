"""The rank side of `helpers.launch`: one process per rank, started by the kernel's forkserver.

Protocol on the duplex connection to the kernel (tuples, first item the kind):
  worker -> kernel: ("started",) first | ("out", stream, text) | ("result", bytes, seq) | ("error", info) |
                    ("unpicklable", info) | ("stuck", report) | ("report", report) |
                    ("aborting", report): the process got SIGABRT and dies next (Gloo's abort on a mismatch)
  kernel -> worker: ("report",) asks for the current state, ("exit",) releases a finished rank.
"""
import contextlib
import datetime
import gc
import json
import multiprocessing
import os
import signal
import sys
import threading
import time
import traceback

import cloudpickle
import torch
import torch.distributed as dist

from helpers.backend import process_group_backend
from helpers.comm import CommLedger
from helpers.launcher import PACKAGE_DIR, device_guard
from helpers.launcher.collective_check import CollectiveCheck
from helpers.launcher.collective_text import (
    collective_call,
    thread_stack,
    traceback_stack,
)
from helpers.launcher.hang import describe_main_thread
from helpers.launcher.on_abort import on_abort

# How often the watchdog looks at the main thread (seconds): small next to any hang_timeout.
_WATCH_PERIOD_S = 0.2


class Channel:
    """The connection to the kernel, shared by the main, output and watchdog threads."""

    def __init__(self, conn):
        self.conn = conn
        self.lock = threading.Lock()
        self.exit_requested = threading.Event()

    def send(self, *message):
        with self.lock:
            self.conn.send(message)

    def serve(self, state):
        """Answer the kernel's requests; exit at once if the kernel goes away."""
        while True:
            try:
                message = self.conn.recv()
            except (EOFError, OSError):
                os._exit(1)  # the kernel died or tore us down: nobody is left to report to
            if message[0] == "report":
                self.send("report", state.report())
            elif message[0] == "exit":
                self.exit_requested.set()


def capture_output(channel):
    """Send everything written to fd 1 and 2 (Python and C++ alike) to the kernel."""
    pumps = []
    for fd, stream in ((1, "stdout"), (2, "stderr")):
        read_end, write_end = os.pipe()
        os.dup2(write_end, fd)
        os.close(write_end)
        pumps.append(threading.Thread(target=_pump, args=(read_end, stream, channel), daemon=True))
        pumps[-1].start()
    # Line buffering so that each print reaches the kernel while the rank is still running.
    sys.stdout = open(1, "w", buffering=1, closefd=False)
    sys.stderr = open(2, "w", buffering=1, closefd=False)
    return pumps


def release_output(pumps, timeout=2.0):
    """Close fds 1 and 2 and wait until the pumps forwarded everything, so output precedes the result."""
    sys.stdout.flush()
    sys.stderr.flush()
    devnull = os.open(os.devnull, os.O_WRONLY)
    for fd in (1, 2):
        os.dup2(devnull, fd)  # the pipe's last write end closes: its pump reads EOF
    os.close(devnull)
    for pump in pumps:
        pump.join(timeout=timeout)


def _pump(read_end, stream, channel):
    while True:
        chunk = os.read(read_end, 65536)
        if not chunk:
            os.close(read_end)
            return
        channel.send("out", stream, chunk.decode(errors="replace"))


class RankState:
    """What this rank is doing, as the watchdog and the kernel's report requests see it."""

    def __init__(self, rank):
        self.rank = rank
        self.phase = "starting"  # starting -> rendezvous -> running -> finished
        self.main_ident = threading.main_thread().ident
        self.check = None  # the CollectiveCheck, under check_collectives=True

    def sequence_number(self):
        """Collectives this rank has issued on the default group (Gloo and NCCL count them)."""
        if not dist.is_initialized():
            return 0
        group = dist.distributed_c10d._get_default_group()
        try:
            if dist.get_backend() != process_group_backend("nccl"):
                return group._get_sequence_number_for_group()
            # Device-mapped group: CPU tensors go to its Gloo backend, CUDA tensors to its NCCL one.
            backends = (group._get_backend(torch.device(d)) for d in ("cpu", "cuda"))
            return sum(b._get_sequence_number_for_group() for b in backends)
        except RuntimeError:  # a backend without sequence numbers
            return -1

    def report(self):
        frame = sys._current_frames().get(self.main_ident)
        report = describe_main_thread(frame) if self.phase != "finished" else {}
        seq = self.sequence_number()
        if self.check is not None and self.check.waiting_on_default:
            seq += 1  # comparing calls before the backend has the collective: count it as issued, as it will be
        report.update(rank=self.rank, phase=self.phase, seq=seq)
        if self.phase == "running":
            report["call"] = collective_call(thread_stack(frame))  # with shapes, for a crash report
        return report


def watch(state, channel, hang_timeout):
    """Report the rank as stuck when its main thread has not moved for hang_timeout seconds."""
    last_key, since = None, time.monotonic()
    while True:
        time.sleep(_WATCH_PERIOD_S)
        if state.phase == "finished":
            return
        if state.phase in ("starting", "rendezvous"):
            # Joining the group is the launcher's work, not the learner's: on a loaded machine it took over lab 02's
            # 3 s (every rank "still joining", reported as a deadlock). init_group's store timeout bounds it.
            last_key, since = None, time.monotonic()
            continue
        frame = sys._current_frames().get(state.main_ident)
        # Same frame, same bytecode offset, same collective count: no progress at all.
        key = (id(frame), frame.f_lasti if frame else None, state.sequence_number())
        if key != last_key:
            last_key, since = key, time.monotonic()
        elif time.monotonic() - since >= hang_timeout:
            channel.send("stuck", state.report())
            return


def init_group(rank, world_size, spec):
    """Join the call's process group through the kernel's TCPStore, under the call's key prefix."""
    # Longer than hang_timeout so that our watchdog, which knows the call sites, speaks first.
    timeout = datetime.timedelta(seconds=spec["hang_timeout"] + spec["timeout_margin"])
    store = dist.TCPStore(spec["host"], spec["port"], is_master=False, timeout=timeout)
    store = dist.PrefixStore(spec["prefix"], store)
    device_id = None
    if spec["backend"] == "nccl":
        # One GPU per rank: without set_device every rank would pile onto cuda:0.
        device_id = torch.device("cuda", rank % torch.cuda.device_count())
        torch.cuda.set_device(device_id)
    # "nccl" joins a device-mapped group (helpers.backend): CUDA tensors over NCCL, CPU tensors over Gloo.
    dist.init_process_group(process_group_backend(spec["backend"]), store=store, rank=rank,
                            world_size=world_size, timeout=timeout, device_id=device_id)
    return store


def run_call(fn, args, kwargs, rank, spec, check=None):
    """fn(*args, **kwargs), under the device guard, the collective check and the collective log when asked for."""
    with contextlib.ExitStack() as stack:
        if spec.get("device_guard"):  # DP_COURSE_DEVICE_GUARD in the kernel (helpers.launcher.device_guard)
            stack.enter_context(device_guard.Guard(spec["device_guard"], shipped=(args, kwargs)))
        if check is not None:  # launch(..., check_collectives=True)
            stack.enter_context(check)
        ledger = stack.enter_context(CommLedger()) if spec.get("collective_log") else None
        try:
            return fn(*args, **kwargs)
        finally:
            if ledger is not None:
                stack.close()  # the ledger's exit stamps the times (CUDA events) before they are written
                write_collective_log(spec["collective_log"], spec["prefix"], rank, ledger.records)


def write_collective_log(directory, prefix, rank, records):
    """Append this rank's device and collectives to a JSON-lines file (DP_COURSE_COLLECTIVE_LOG, make gpu-check)."""
    from helpers.backend import rank_device

    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, f"{prefix.strip('/').replace('/', '-')}-rank{rank}.jsonl")
    with open(path, "a") as f:
        f.write(json.dumps({"rank": rank, "rank_device": str(rank_device())}) + "\n")
        for r in records:
            f.write(json.dumps({"rank": rank, **r.as_dict()}) + "\n")


def error_info(exc):
    """The exception as plain data; the kernel fills in notebook source lines it alone knows."""
    frames = [(f.filename, f.lineno, f.name, f.line) for f in traceback.extract_tb(exc.__traceback__)]
    frames = [f for f in frames if not f[0].startswith(PACKAGE_DIR + os.sep)]
    return {"type": type(exc).__name__, "message": str(exc), "frames": frames,
            "text": "".join(traceback.format_exception(exc)),
            # the collective it was raised in (a peer's crash shows here), and a CollectiveMismatch's calls
            "call": collective_call(traceback_stack(exc.__traceback__)), "calls": getattr(exc, "calls", None)}


def main(rank, world_size, spec, conn):
    """Entry point of a rank: set up, run the shipped function, report, wait to be released."""
    # What the forkserver held stays out of this process's collections: a collection walking it writes to pages
    # the fork shares (copy-on-write faults). Measured: a rank's CPU until its function returns 35 -> 32 ms.
    gc.freeze()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the kernel handles interrupts and tears us down
    torch.set_num_threads(spec["threads"])  # several ranks share few cores
    # A rank may start processes of its own (a DataLoader's workers). The kernel starts it as a daemon, and
    # multiprocessing refuses children to a daemon ("daemonic processes are not allowed to have children"); the flag
    # is cleared here, in the rank only: the kernel still tears the rank down, and the rank's children see it go.
    multiprocessing.current_process().daemon = False
    # ... and starts them as a script under torchrun would on Linux before Python 3.14: by fork, so that a dataset
    # class defined in a notebook cell reaches the workers without pickling (the forkserver child inherits
    # "forkserver" otherwise, and pickling a class of the cell fails).
    multiprocessing.set_start_method("fork", force=True)
    channel = Channel(conn)
    channel.send("started")  # a rank that dies before this died while multiprocessing prepared it
    state = RankState(rank)
    threading.Thread(target=channel.serve, args=(state,), daemon=True).start()
    pumps = capture_output(channel)
    threading.Thread(target=watch, args=(state, channel, spec["hang_timeout"]), daemon=True).start()
    on_abort(lambda: _report_abort(channel, state, pumps))
    try:
        state.phase = "rendezvous"
        store = init_group(rank, world_size, spec)
        if spec.get("check_collectives"):
            state.check = CollectiveCheck(store)
        state.phase = "running"
        fn, args, kwargs = cloudpickle.loads(spec["call"])
        result = run_call(fn, args, kwargs, rank, spec, state.check)
    except BaseException as exc:  # noqa: BLE001 - everything a rank raises goes to the kernel
        state.phase = "finished"
        release_output(pumps)
        channel.send("error", error_info(exc))
        _wait_and_exit(channel, 1)
    state.phase = "finished"
    release_output(pumps)
    _send_result(channel, result, state)
    _wait_and_exit(channel, 0)


def _report_abort(channel, state, pumps):
    """Runs in the thread that called abort(): where the main thread is, after what C++ printed (Gloo's why)."""
    report = state.report()
    release_output(pumps, timeout=0.5)
    channel.send("aborting", report)


def _send_result(channel, result, state):
    try:
        payload = cloudpickle.dumps(result)
    except Exception as exc:  # noqa: BLE001 - any pickling failure is the user's to fix
        channel.send("unpicklable", {"type": type(result).__name__, "message": f"{type(exc).__name__}: {exc}"})
        return
    channel.send("result", payload, state.sequence_number())


def _wait_and_exit(channel, code):
    # A finished rank stays in the group until every rank is done, so that a rank which skipped a
    # collective leaves its peers blocked (a hang we can report) instead of crashing them.
    channel.exit_requested.wait()
    os._exit(code)  # skip atexit and Gloo's teardown: the kernel already has everything
