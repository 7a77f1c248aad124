"""Checks of lab 2.4: ring_all_reduce, in place against dist.all_reduce, and its 2(N-1)/N S bytes per rank."""
import torch.distributed as dist

from helpers.comm import CommLedger
from helpers.grading.checks.lab02.common import (
    BYTES_NUMEL,
    BYTES_WORLD_SIZES,
    DTYPES,
    SHAPES,
    WORLD_SIZES,
    _assert_point_to_point,
    _assert_same_values,
    _assert_wire_bytes,
    _launch,
    _rank_data,
    _traffic,
    _where,
)
from helpers.grading.registry import answer, public_check

# --- 2.4 ring_all_reduce ---------------------------------------------------------------------------

def _on_ranks_all_reduce(fn, cases):
    rank = dist.get_rank()
    results = []
    for shape, dtype in cases:
        x = _rank_data(shape, dtype, rank)
        reference = x.clone()
        dist.all_reduce(reference)  # outside the ledger: only the student's traffic is counted
        with CommLedger() as ledger:
            out = fn(x)
        results.append((shape, dtype, x, out is x, reference, *_traffic(ledger)))
    return results


@public_check("2.4")
def all_reduce_matches_dist_all_reduce(ns):
    fn = answer(ns, "ring_all_reduce")
    cases = [(shape, dtype) for shape in SHAPES for dtype in DTYPES]
    for n in WORLD_SIZES:
        for rank, result in enumerate(_launch(_on_ranks_all_reduce, n, (fn, cases), "ring_all_reduce")):
            for shape, dtype, x, returned_x, reference, ops, _ in result:
                where = _where(rank, shape, dtype, n)
                _assert_same_values(x, reference, where,
                                    "the tensor after the call (it must hold dist.all_reduce's sum, in place)")
                assert returned_x, f"{where}: return the tensor you were given (summed in place), like x = f(x)"
                _assert_point_to_point(ops, where, "ring_all_reduce")


@public_check("2.4")
def all_reduce_sends_2_n_minus_1_over_n(ns):
    fn = answer(ns, "ring_all_reduce")
    for n in BYTES_WORLD_SIZES:
        results = _launch(_on_ranks_all_reduce, n, (fn, [((BYTES_NUMEL,), "float32")]), "ring_all_reduce")
        sent = [result[0][-1] for result in results]
        _assert_wire_bytes(sent, BYTES_NUMEL, 4, 2 * (n - 1) / n, "all-reduce")
