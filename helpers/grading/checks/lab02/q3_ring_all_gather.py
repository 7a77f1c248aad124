"""Checks of lab 2.3: ring_all_gather, its result and its (N-1)/N S bytes per rank."""
import torch
import torch.distributed as dist

from helpers.comm import CommLedger
from helpers.grading.checks.lab02 import common
from helpers.grading.checks.lab02.common import (
    BYTES_NUMEL,
    BYTES_WORLD_SIZES,
    DTYPES,
    WORLD_SIZES,
    _assert_point_to_point,
    _assert_same_values,
    _assert_wire_bytes,
    _launch,
    _traffic,
)
from helpers.grading.registry import answer, public_check

# --- 2.3 ring_all_gather ---------------------------------------------------------------------------

def _global_vector(numel, dtype):
    """The vector every rank holds a chunk of in the all-gather checks: 0.5, 1.5, 2.5, ... (exact)."""
    if dtype == "int64":
        return torch.arange(numel) * 3 - 7 + common.OFFSET
    return torch.arange(numel, dtype=torch.float32) + 0.5 + common.OFFSET


def _on_ranks_all_gather(fn, cases):
    rank, n = dist.get_rank(), dist.get_world_size()
    results = []
    for numel, dtype in cases:
        chunk = torch.tensor_split(_global_vector(numel, dtype), n)[rank].clone()
        with CommLedger() as ledger:
            out = fn(chunk, numel)
        results.append((numel, dtype, out, *_traffic(ledger)))
    return results


@public_check("2.3")
def all_gather_rebuilds_the_vector(ns):
    fn = answer(ns, "ring_all_gather")
    cases = [(numel, dtype) for numel in (1, 2, 5, 10, 1001) for dtype in DTYPES]
    for n in WORLD_SIZES:
        for rank, result in enumerate(_launch(_on_ranks_all_gather, n, (fn, cases), "ring_all_gather")):
            for numel, dtype, out, ops, _ in result:
                where = f"world size {n}, rank {rank}, numel {numel}, {dtype}"
                _assert_same_values(out, _global_vector(numel, dtype), where,
                                    "the gathered vector (every rank's chunk, in rank order)")
                _assert_point_to_point(ops, where, "ring_all_gather")


@public_check("2.3")
def all_gather_sends_n_minus_1_over_n(ns):
    fn = answer(ns, "ring_all_gather")
    for n in BYTES_WORLD_SIZES:
        results = _launch(_on_ranks_all_gather, n, (fn, [(BYTES_NUMEL, "float32")]), "ring_all_gather")
        sent = [result[0][-1] for result in results]
        _assert_wire_bytes(sent, BYTES_NUMEL, 4, (n - 1) / n, "all-gather")
