"""Hidden tests of lab 02 (collectives, ring all-reduce). Public in this repository: see the README.

Every probe returns, per rank, the values and the collectives the rank issued (helpers.comm.CommLedger rows);
the grader requires the solution's values, point-to-point messages only, and a ring's bytes: exactly the
solution's total, each rank within 1 % of its share (an unchunked ring sends (N-1) S per rank).
"""
from helpers.grading.probes import Probe
from helpers.grading.probes.judges import judged, point_to_point, ring_bytes

SETUP = '''
import torch as _probe_torch
import torch.distributed as _probe_dist
import helpers.comm as _probe_comm
import helpers.grading.probe_runtime as _probe_rt
from helpers.grading.shared_run import launch_gloo as _probe_launch

def _probe_mine(numel, dtype=_probe_torch.float32):
    """This rank's secret input."""
    g = _probe_torch.Generator().manual_seed(_PROBE_SEED + 100 + _probe_dist.get_rank())
    if dtype == _probe_torch.int64:
        return _probe_torch.randint(-1000, 1000, (numel,), generator=g)
    return _probe_torch.randn(numel, generator=g)

def _probe_traced(fn, *args):
    """fn(*args) and the ledger rows of the collectives it issued (modules looked up on this rank)."""
    with _probe_comm.CommLedger() as ledger:
        out = fn(*args)
    return out, _probe_rt.records(ledger)

def _probe_exchange():
    t = _probe_mine(3)
    out, rows = _probe_traced(exchange_with_neighbours, t)
    return {"out": list(out), "input": t, "ledger": rows}

def _probe_reduce_scatter(numel, every=1):
    t = _probe_mine(numel)
    out, rows = _probe_traced(ring_reduce_scatter, t)
    return {"out": out[::every], "input": t[::every], "ledger": rows}

def _probe_all_gather(numel, every=1):
    rank, n = _probe_dist.get_rank(), _probe_dist.get_world_size()
    chunk = _probe_torch.tensor_split(_probe_mine(numel), n)[rank].clone()
    out, rows = _probe_traced(ring_all_gather, chunk, numel)
    return {"out": out[::every], "ledger": rows}

def _probe_all_reduce(shape, dtype, every=1):
    t = _probe_mine(int(_probe_torch.tensor(shape).prod()), dtype).reshape(shape)
    out, rows = _probe_traced(ring_all_reduce, t)
    return {"out": out.reshape(-1)[::every], "input": t.reshape(-1)[::every], "ledger": rows}   # in place: t is the sum

def _probe_average():
    _probe_torch.manual_seed(_PROBE_SEED + 3)
    width = 3 + _PROBE_SEED % 4
    model = _probe_torch.nn.Sequential(_probe_torch.nn.Linear(4, width), _probe_torch.nn.Linear(width, 2))
    model(_probe_mine(8).view(2, 4)).square().mean().backward()
    _, rows = _probe_traced(average_gradients, model)
    numel = sum(p.numel() for p in model.parameters())
    _, one_call = _probe_traced(ring_all_reduce, _probe_torch.ones(numel))
    return {"grads": [p.grad for p in model.parameters()], "ledger": rows, "one_call": one_call}
'''

_P2P = {q: point_to_point(name) for q, name in
        (("2.1", "exchange_with_neighbours"), ("2.2", "ring_reduce_scatter"), ("2.3", "ring_all_gather"),
         ("2.4", "ring_all_reduce"), ("2.5", "average_gradients"))}


def _one_ring_call(expected, actual):
    """Rule of 2.5: average_gradients sends exactly as many messages as ONE ring_all_reduce of all gradients."""
    for rank, value in enumerate(actual):
        calls = sum(row[0] == "send" for row in value["ledger"])
        once = sum(row[0] == "send" for row in value["one_call"])
        if calls != once:
            return (f"rank {rank}: average_gradients issued {calls} sends, one ring_all_reduce issues {once}: pack "
                    "every gradient into one flat tensor and call ring_all_reduce once")
    return ""


def _launch(fn, world_size, args=""):
    return f"_probe_launch({fn}, {world_size}, args=({args}), hang_timeout=10)"


# Which ring collective each question rebuilds, and the library calls that would skip the ring.
_COLLECTIVES = ("all_reduce", "reduce_scatter", "reduce_scatter_tensor", "reduce_scatter_single",
                "_reduce_scatter_base", "all_gather", "all_gather_into_tensor", "all_gather_single", "_all_gather_base",
                "all_to_all", "all_to_all_single", "broadcast", "all_gather_object", "batch_isend_irecv")
_BYTES = "_PROBE_SEED % 2 + 3"          # 3 or 4 ranks: at 2 an unchunked ring sends as much as a chunked one
_NUMEL = "1000 + _PROBE_SEED % 500"     # large enough for the 1 % rule; every 37th element returned

# A different ring (another order of chunks) issues other rows: only the rules judge them, never equality.
_SKIP = ("ledger", "one_call")

PROBES = [Probe(q, name, expr, points=points, judge=judged(*rules, skip=_SKIP, atol=1e-5), forbidden=_COLLECTIVES)
          for q, name, expr, points, rules in [
    ("2.1", "3 ranks", _launch("_probe_exchange", 3), 1, [_P2P["2.1"]]),
    ("2.1", "4 ranks", _launch("_probe_exchange", 4), 1, [_P2P["2.1"]]),
    ("2.2", "3 ranks, 5-11 elements", _launch("_probe_reduce_scatter", 3, "5 + _PROBE_SEED % 7,"), 1, [_P2P["2.2"]]),
    ("2.2", "4 ranks, 2 elements (empty chunks)", _launch("_probe_reduce_scatter", 4, "2,"), 1, [_P2P["2.2"]]),
    ("2.2", "3 or 4 ranks: (N-1)/N S bytes per rank", _launch("_probe_reduce_scatter", _BYTES, f"{_NUMEL}, 37"), 1,
     [_P2P["2.2"], ring_bytes("reduce-scatter")]),
    ("2.3", "3 ranks, 10-15 elements", _launch("_probe_all_gather", 3, "10 + _PROBE_SEED % 6,"), 1, [_P2P["2.3"]]),
    ("2.3", "3 or 4 ranks: (N-1)/N S bytes per rank", _launch("_probe_all_gather", _BYTES, f"{_NUMEL}, 37"), 1,
     [_P2P["2.3"], ring_bytes("all-gather")]),
    ("2.4", "3 ranks, float32 (2, 5-8), in place", _launch("_probe_all_reduce", 3,
                                                          "(2, 5 + _PROBE_SEED % 4), _probe_torch.float32"), 1,
     [_P2P["2.4"]]),
    ("2.4", "4 ranks, int64 of 1-3 elements", _launch("_probe_all_reduce", 4,
                                                      "(1 + _PROBE_SEED % 3,), _probe_torch.int64"), 1,
     [_P2P["2.4"]]),
    ("2.4", "3 or 4 ranks: 2(N-1)/N S bytes per rank", _launch("_probe_all_reduce", _BYTES,
                                                              f"({_NUMEL},), _probe_torch.float32, 37"), 1,
     [_P2P["2.4"], ring_bytes("all-reduce")]),
    ("2.5", "3 ranks, a two-layer model: the mean, with one ring_all_reduce", _launch("_probe_average", 3), 2,
     [_P2P["2.5"], _one_ring_call]),
]]

# The earlier answers each question's probes call, directly or through other answers, graded with the
# solution's versions bound in their place (helpers/grading/reference.py): ring_all_reduce is a reduce-scatter then an
# all-gather; average_gradients calls ring_all_reduce.
USES = {'2.4': ('2.2', '2.3'), '2.5': ('2.2', '2.3', '2.4')}
