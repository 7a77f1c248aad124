"""The mistakes of one question through check() together, their launches batched: one launch runs many checks' calls.

A launch costs ~0.09 CPU-s per rank before any work (fork, process group, teardown); the catalogue's 187 mistakes
made 239 launches, most of them the same rank function on the same world size with another wrong answer in its
arguments. Here each mistake's check() runs in a thread of its own, one thread at a time (a baton): a thread that
launches hands its call to the scheduler and waits. When no thread can run, the scheduler runs the waiting calls,
those of one world size and hang timeout in one launch (`_batch_on_rank`, one call after the other in one process
group), and wakes the threads with their ranks' results. check() itself is untouched: it sees the results a launch
of its own would return.

What a call of its own would have is kept: the random state of a fresh rank is restored before every call, and grad
mode and the default dtype after it. A call is served from the batch only if every rank returned from it and issued
as many collectives as the others (a fence on a group of its own compares them); otherwise it is launched again on
its own, so a hang, a crash or an exception reaches check() exactly as the launcher reports it, and the calls after
it go to the next batch. Calls with check_collectives=True are launched on their own.
Grouped (at the end) is how a test file uses it: the first selected test of a group computes the group's results.
DP_BATCH_LOG=<file> appends a line per launch (a batch and what its ranks agreed on, or a call alone) to that file.
"""
import datetime
import os
import pickle
import random
import sys
import tempfile
import threading

import cloudpickle

# A rank that finished a call waits this long at the fence for its peers to finish theirs; past it the batch stops
# there (that call and the ones after it are launched again). A peer blocked in a collective its neighbour skipped
# never comes: the wait is what such a mistake costs on top of its own launch, an idle core. 3 s made
# test_mistakes 130 s of wall for 90 CPU-s in make test; 1 s: lab 03's and 05's mistakes 36.4 -> 24.4 and 21.8 s of
# wall, the same CPU. A peer merely slow past it (a loaded machine) costs the calls after it a launch of their own.
FENCE_S = 1.0


def _sequence_number():
    import torch.distributed as dist

    try:
        return dist.distributed_c10d._get_default_group()._get_sequence_number_for_group()
    except (RuntimeError, AttributeError):
        return -1


def _batch_on_rank(calls, directory, fence_s):
    """On each rank: every pickled (fn, args, kwargs) in turn; [(status, pickled result or error, collectives)].

    After each call the ranks meet on a group of their own and compare (status, collectives issued); a difference
    or a fence that times out stops the batch. Each agreed call's result is also written to `directory`, so a batch
    that a later call turns into a hang still serves the calls before it.
    """
    import torch
    import torch.distributed as dist

    rank = dist.get_rank()
    fence = dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=fence_s))
    fresh = torch.get_rng_state(), random.getstate()
    numpy_state = sys.modules["numpy"].random.get_state() if "numpy" in sys.modules else None
    dtype = torch.get_default_dtype()
    out = []
    for index, blob in enumerate(calls):
        torch.set_rng_state(fresh[0])
        random.setstate(fresh[1])
        if numpy_state is not None:
            sys.modules["numpy"].random.set_state(numpy_state)
        start = _sequence_number()
        try:
            fn, args, kwargs = cloudpickle.loads(blob)
            item = ("ok", cloudpickle.dumps(fn(*args, **kwargs)))
        except BaseException as exc:  # noqa: BLE001 - launched again on its own, where the launcher reports it
            item = ("error", f"{type(exc).__name__}: {exc}")
        torch.set_grad_enabled(True)
        torch.set_default_dtype(dtype)
        item += (_sequence_number() - start,)
        seen = [None] * dist.get_world_size()
        try:
            dist.all_gather_object(seen, (item[0], item[2]), group=fence)
        except Exception:  # noqa: BLE001 - a peer never came: this call and the rest go again
            return out
        out.append(item)
        if len(set(seen)) > 1:
            return out  # the ranks disagree: collectives may be left paired across calls
        with open(os.path.join(directory, f"{index}-{rank}"), "wb") as f:
            pickle.dump(item, f)
    return out


class _Request:
    def __init__(self, context, world_size, spec):
        self.context, self.world_size, self.spec = context, world_size, spec
        self.done = threading.Event()
        self.ranks = self.error = None

    def key(self):
        spec = self.spec
        return self.world_size, spec["backend"], spec["hang_timeout"], spec["device_guard"], spec["collective_log"]

    def batchable(self):
        return not self.spec["check_collectives"]


class Batcher:
    """Runs functions in threads, one at a time, and their launches in batches (see the module docstring)."""

    def __init__(self):
        self.baton = threading.Lock()
        self.cond = threading.Condition()
        self.runnable = 0
        self.waiting = []
        self.local = threading.local()  # .batched: a thread whose launches are batched
        self.launches = 0

    # --- thread side ----------------------------------------------------------------------------------------------
    def _submit(self, context, world_size, spec):
        request = _Request(context, world_size, spec)
        with self.cond:
            self.waiting.append(request)
            self.runnable -= 1
            self.cond.notify_all()
        self.baton.release()
        request.done.wait()
        self.baton.acquire()
        if request.error is not None:
            raise request.error
        return [cloudpickle.loads(result) for result in request.ranks]

    def _thread(self, fn, slot):
        self.local.batched = True
        self.baton.acquire()
        try:
            slot.append(("ok", fn()))
        except BaseException as exc:  # noqa: BLE001 - re-raised by the test that reads it
            slot.append(("error", exc))
        finally:
            with self.cond:
                self.runnable -= 1
                self.cond.notify_all()
            self.baton.release()

    # --- scheduler side -------------------------------------------------------------------------------------------
    def run(self, fns):
        """[("ok", fn()) or ("error", exception)] for each fn, run as described above."""
        import importlib

        launch_module = importlib.import_module("helpers.launch")  # the module (helpers.launch is also a function)
        real_run, batcher = launch_module.Run, self

        class Run:
            def __init__(self, context, world_size, spec):
                self.args = context, world_size, spec

            def __enter__(self):
                return self

            def __exit__(self, *exc):
                return False

            def wait(self):
                if getattr(batcher.local, "batched", False):
                    return batcher._submit(*self.args)
                with real_run(*self.args) as run:
                    return run.wait()

        slots = [[] for _ in fns]
        launch_module.Run = Run
        try:
            with self.cond:
                self.runnable = len(fns)
            for fn, slot in zip(fns, slots):
                thread = threading.Thread(target=self._thread, args=(fn, slot), daemon=True)
                thread.start()
            while True:
                with self.cond:
                    self.cond.wait_for(lambda: self.runnable == 0)
                    waiting, self.waiting = self.waiting, []
                if not waiting:
                    break
                self._serve(waiting, real_run, launch_module.runtime())
                with self.cond:
                    self.runnable += len(waiting)
                for request in waiting:
                    request.done.set()
        finally:
            launch_module.Run = real_run
        return [slot[0] for slot in slots]

    def _serve(self, waiting, real_run, runtime):
        groups = {}
        for request in waiting:
            groups.setdefault(request.key() if request.batchable() else id(request), []).append(request)
        for requests in groups.values():
            while requests:
                if len(requests) == 1:
                    self._alone(requests.pop(), real_run)
                    continue
                failed, stop = self._batch(requests, real_run, runtime)
                for index in failed:
                    self._alone(requests[index], real_run)
                if stop == 0:  # the first call kept the batch from reporting anything: it goes on its own
                    self._alone(requests[0], real_run)
                    stop = 1
                requests = requests[stop:]

    def _alone(self, request, real_run):
        self.launches += 1
        _log("alone", request.world_size)
        try:
            with real_run(request.context, request.world_size, request.spec) as run:
                request.ranks = [cloudpickle.dumps(r) for r in run.wait()]
        except Exception as exc:  # noqa: BLE001 - the thread raises it where its launch was
            request.error = exc

    def _batch(self, requests, real_run, runtime):
        """Run the requests' calls in one launch and serve those the ranks agreed on; return (the indices of the calls
        that ran but must run again on their own, the index of the first call the batch did not finish)."""
        from helpers.errors import LaunchError

        first = requests[0]
        calls = [r.spec["call"] for r in requests]
        with tempfile.TemporaryDirectory(prefix="dp-batch-") as directory:
            fence_s = min(FENCE_S, 0.8 * first.spec["hang_timeout"])  # the watchdog must not speak first
            call = cloudpickle.dumps((_batch_on_rank, (calls, directory, fence_s), {}))
            spec = runtime.spec(first.spec["backend"], first.spec["hang_timeout"], call)
            spec.update(device_guard=first.spec["device_guard"], collective_log=first.spec["collective_log"])
            self.launches += 1
            try:
                with real_run(runtime.context, first.world_size, spec) as run:
                    per_rank = run.wait()
            except LaunchError as exc:
                per_rank = _written(directory, first.world_size, len(calls))
                _log("batch failed", type(exc).__name__, str(exc)[:300])
        _log("batch", len(calls), first.world_size, [len(r) for r in per_rank],
             [[(i[0], i[2]) for i in r] for r in per_rank])
        failed = []
        for index, request in enumerate(requests):
            items = [ranks[index] if index < len(ranks) else None for ranks in per_rank]
            if any(item is None for item in items):
                return failed, index  # the batch stopped here: this call and the rest go again
            if any(item[0] != "ok" for item in items) or len({item[2] for item in items}) > 1:
                failed.append(index)  # it raised, or the ranks disagree: on its own, as the launcher reports it
            else:
                request.ranks = [item[1] for item in items]
        return failed, len(requests)


def _log(*what):
    if os.environ.get("DP_BATCH_LOG"):
        import time
        with open(os.environ["DP_BATCH_LOG"], "a") as f:
            print("[batch]", round(time.monotonic() % 1000, 2), *what, file=f)


def _written(directory, world_size, n):
    """What the ranks of a failed batch wrote: for each rank, the agreed items before the first missing one."""
    per_rank = []
    for rank in range(world_size):
        items = []
        for index in range(n):
            try:
                with open(os.path.join(directory, f"{index}-{rank}"), "rb") as f:
                    items.append(pickle.load(f))
            except OSError:
                break
        per_rank.append(items)
    return per_rank



def selected_ids(request):
    """The parameter ids of the selected tests of the requesting test function (all of them, or those -k kept).

    Of its own module: test_lab03_checks and test_lab08_checks both have a test_wrong_..._fail."""
    return [item.callspec.id for item in request.session.items
            if getattr(item, "originalname", None) == request.node.originalname and hasattr(item, "callspec")
            and item.module is request.node.module]


class Grouped:
    """fn(key) for the tests of a parametrized function, a group at a time: the first test of a group computes the
    results of every key of its group not yet read, their launches batched; each test then reads its own."""

    def __init__(self, fn):
        self.fn = fn
        self.results = {}  # key -> ("ok", value) or ("error", exception), until its test reads it
        self.read = set()

    def result(self, key, group):
        if key not in self.results:
            keys = [key] + [k for k in group if k != key and k not in self.read and k not in self.results]
            self.results.update(zip(keys, Batcher().run([lambda k=k: self.fn(k) for k in keys])))
        self.read.add(key)
        status, value = self.results.pop(key)
        if status == "error":
            raise value
        return value
