"""`launch(fn, n, check_collectives=True)`: before every collective, the ranks of its group compare their calls.

Without the check, ranks that disagree on a collective hang (all_reduce on one rank, broadcast on the other),
crash (Gloo aborts on all_reduce of 4 elements against 5) or silently compute a wrong result (SUM on one rank,
MAX on the other: no error at all). With it, every rank raises CollectiveMismatch before the backend sees the
call, naming each rank's call and line.

Protocol, per collective on a group G, on every rank of G (the k-th collective this rank issues on G):
  1. describe the call as the backend gets it (the c10d op: its name, the shapes and dtypes that must agree on
     every rank, the reduce op, the root), as JSON;
  2. set  check/<G>/<k>/<group rank>  in the launch's TCPStore to it;
  3. multi_get the keys of all ranks of G (TCPStore waits until every key exists), then delete our key of k-1
     (every rank that wrote key k has read all keys of k-1), so the store does not grow with the run;
  4. equal bytes: go on. Otherwise every rank of G sees the difference; each adds its line of code under
     check/<G>/<k>/details/<group rank>, reads the others', and raises CollectiveMismatch: none calls the backend.
The hook is the ledger's dispatcher kernel (helpers.comm), so collectives that PyTorch issues from C++ (DDP's
gradient buckets) are checked too. Point-to-point ops and monitored_barrier are not: they pair ranks.
all_to_all compares the op only: uneven splits are legal.

Cost per collective, `python -m tests.bench_collective_check` (all_reduce of one float32, median of 2,000 calls
per rank, Gloo, this 2-core machine shared with other jobs, two runs at load averages 6 and 10):
    2 ranks: plain 264 / 252 us, checked +0.56 / +1.75 ms; TORCH_DISTRIBUTED_DEBUG=DETAIL +2.9 / +3.6 ms
    4 ranks: plain 1.15 / 2.2 ms, checked +6.1 / +4.2 ms;  DETAIL +11.1 / +10.4 ms
About 0.3 ms of it is this module and three TCPStore round trips (one process, idle store); the rest is waiting
for the kernel's store thread and the other ranks on oversubscribed cores. It does not grow with the tensor.
With check_collectives=False nothing here runs: the launcher opens no ledger (tests/test_collective_mismatch.py).

PyTorch's own check, TORCH_DISTRIBUTED_DEBUG=DETAIL (a ProcessGroupWrapper around every group), seen on Gloo in
torch 2.13 with 2 ranks: it raises on different shapes, dtypes and collectives (its message gives op type, shapes
and dtypes per rank, but no line of code); it lets SUM on one rank and MAX on the other through (both get a wrong
result, no error), and on broadcasts with different roots both ranks wait until the process-group timeout.
This check catches all five (tests/test_collective_mismatch.py).
"""
import json
import sys
import time

import torch
import torch.distributed as dist

from helpers.comm import CommLedger
from helpers.errors import CollectiveMismatch
from helpers.launcher.collective_text import (
    call_text,
    collective_call,
    differences,
    ranks_text,
    reduce_op_name,
    thread_stack,
    value_text,
)
from helpers.launcher.hang import describe_site, is_user_file

# c10d op -> (the name a learner calls it by, argument indices whose shapes and dtypes must agree on every rank,
# index of the reduce op, index of the root rank). Schemas: torch.ops.c10d.<op>.default._schema.
_AGREE = {
    "allreduce_": ("all_reduce", (0,), 2, None),
    "allreduce_coalesced_": ("all_reduce_coalesced", (0,), 2, None),
    "broadcast_": ("broadcast", (0,), None, 2),
    "allgather_": ("all_gather", (0, 1), None, None),
    "_allgather_base_": ("all_gather_into_tensor", (0, 1), None, None),
    "allgather_coalesced_": ("all_gather_coalesced", (0, 1), None, None),
    "allgather_into_tensor_coalesced_": ("all_gather_into_tensor_coalesced", (0, 1), None, None),
    "reduce_scatter_": ("reduce_scatter", (0, 1), 3, None),
    "_reduce_scatter_base_": ("reduce_scatter_tensor", (0, 1), 3, None),
    "reduce_scatter_tensor_coalesced_": ("reduce_scatter_tensor_coalesced", (0, 1), 3, None),
    "reduce_": ("reduce", (0,), 2, 3),
    "gather_": ("gather", (1,), None, 3),  # the output list exists on the root only
    "scatter_": ("scatter", (0,), None, 3),  # the input list exists on the root only
    "alltoall_": ("all_to_all", (), None, None),
    "alltoall_base_": ("all_to_all_single", (), None, None),
    "barrier": ("barrier", (), None, None),
}


def backend_call(c10d_op, args):
    """What must agree across ranks, as a call: {"op": "all_reduce", "args": {"tensor": "float32[4]", "op": "SUM"}}."""
    name, tensors, reduce_at, root_at = _AGREE[c10d_op]
    out = {}
    for i in tensors:
        key = "tensor" if len(tensors) == 1 else ("output", "input")[i]
        out[key] = value_text(args[i])
    if reduce_at is not None:
        out["op"] = reduce_op_name(args[reduce_at].op())  # a ScriptObject holding the ReduceOp's number
    if root_at is not None:
        out["root"] = str(args[root_at])  # the root's rank within the group
    return {"op": name, "args": out}


def _caller():
    """(the torch.distributed function the user called, or None; the user's line, or None)."""
    stack = thread_stack(sys._getframe())
    call = collective_call(stack)
    if call is not None:
        return call["op"], call["site"]
    users = [(f, line) for f, line in stack if is_user_file(f.f_code.co_filename)]
    if not users:
        return None, None
    frame, line = users[-1]
    return None, (frame.f_code.co_filename, line, frame.f_code.co_name)


class CollectiveCheck:
    """The check in one rank: `with CollectiveCheck(store):` around the rank's function."""

    def __init__(self, store):
        self.store = dist.PrefixStore("check/", store)
        self.counts = {}  # group name -> collectives checked on it
        # True while this rank waits for its peers' calls on the default group: the hang report counts the
        # collective as issued (the backend's sequence number does not yet), as it does once the backend has it.
        self.waiting_on_default = False

    def __enter__(self):
        self.ledger = CommLedger(check=self, keep_records=False).__enter__()
        return self

    def __exit__(self, *exc):
        self.ledger.__exit__(*exc)
        return False

    def __call__(self, record, tensors, args):
        """The ledger's check: exchange this call with the group's other ranks; raise if they differ."""
        c10d_op = record.c10d_op.removeprefix("c10d::")
        if c10d_op not in _AGREE:
            return
        group = next(a for a in args if isinstance(a, torch.ScriptObject))
        group = torch._C._distributed_c10d.ProcessGroup.unbox(group)
        name = group.group_name
        k = self.counts[name] = self.counts.get(name, 0) + 1
        call = backend_call(c10d_op, args)
        default = name == dist.distributed_c10d._get_default_group().group_name
        self.waiting_on_default = default
        try:
            # Equal calls give equal bytes: the usual case costs no decoding and no stack walk.
            mine = json.dumps(call).encode()
            values = self._exchange(f"{name}/{k}", group.rank(), group.size(), mine)
            if k > 1:
                self.store.delete_key(f"{name}/{k - 1}/{group.rank()}")
            if all(v == mine for v in values):
                return
            op, site = _caller()
            mine = {"rank": dist.get_rank(), "call": call, "shown": {**call, "op": op or call["op"]}, "site": site,
                    "index": k, "default_group": default}
            calls = self._exchange(f"{name}/{k}/details", group.rank(), group.size(), json.dumps(mine).encode())
        finally:
            self.waiting_on_default = False
        calls = [json.loads(c) for c in calls]
        for c in calls:
            c["site"] = tuple(c["site"]) if c["site"] else None  # JSON made the tuple a list
        raise CollectiveMismatch(mismatch_text(calls), calls=calls)

    def _exchange(self, key, rank, size, value):
        """Every rank's value under key (store protocol in the module docstring)."""
        self.store.set(f"{key}/{rank}", value)
        return self.store.multi_get([f"{key}/{r}" for r in range(size)])


def mismatch_text(calls):
    """The CollectiveMismatch message: each rank's call and line, then what differs and what to do.

    The kernel writes it again from the same calls: a notebook cell's source lives only in the kernel."""
    k = calls[0]["index"]
    where = "the default group" if calls[0]["default_group"] else f"the group of {ranks_text(c['rank'] for c in calls)}"
    lines = {}
    for c in calls:
        lines.setdefault((call_text(c["shown"]), c["site"]), []).append(c["rank"])
    head = (f"the ranks called different collectives as collective #{k} on {where}; check_collectives stopped "
            "them before it ran:")
    body = [f"  {ranks_text(ranks)}: {text} at {describe_site(site) if site else 'PyTorch code (no line of yours)'}"
            for (text, site), ranks in lines.items()]
    diff = differences({c["rank"]: c["call"] for c in calls})
    what = ("They differ in " + "; ".join(diff) + ".") if diff else "They differ in how PyTorch issues them."
    advice = ("Every rank must call the same collectives in the same order, with the same shapes, dtypes, reduce "
              "op and root: look for a shape, an op or a branch that depends on the rank.")
    return "\n".join([head, *body, what, advice])


def timed_all_reduces(calls, detail=False, warm_up=50):
    """On a rank: seconds of each of `calls` all_reduces of one float32, after `warm_up` untimed ones; on the
    default group, or (detail) on a copy of it made under DebugLevel.DETAIL, as TORCH_DISTRIBUTED_DEBUG=DETAIL makes
    every group. One element makes the collective as cheap as it gets, so a check's cost shows whole: neither check
    grows with the tensor (the fingerprints are the same size)."""
    group = None
    if detail:
        dist.set_debug_level(dist.DebugLevel.DETAIL)  # groups made from now on get the fingerprint check
        group = dist.new_group(backend="gloo")
    from helpers.backend import rank_device

    t = torch.ones(1, device=rank_device())
    times = []
    for _ in range(warm_up + calls):
        start = time.perf_counter()
        dist.all_reduce(t, group=group)
        times.append(time.perf_counter() - start)
    return times[warm_up:]

