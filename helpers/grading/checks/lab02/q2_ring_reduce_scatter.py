"""Checks of lab 2.2: ring_reduce_scatter, its result and its (N-1)/N S bytes per rank."""
import torch
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
    _sum_of_ranks,
    _traffic,
    _where,
)
from helpers.grading.registry import answer, public_check

# --- 2.2 ring_reduce_scatter -----------------------------------------------------------------------

def _numel(shape):
    return int(torch.Size(shape).numel())


def _on_ranks_reduce_scatter(fn, cases):
    rank, n = dist.get_rank(), dist.get_world_size()
    results = []
    for shape, dtype in cases:
        x = _rank_data(shape, dtype, rank)
        before = x.clone()
        with CommLedger() as ledger:
            out = fn(x)
        expected = torch.tensor_split(_sum_of_ranks(shape, dtype, n).reshape(-1), n)[rank]
        results.append((shape, dtype, out, expected, torch.equal(x, before), *_traffic(ledger)))
    return results


@public_check("2.2")
def reduce_scatter_matches_tensor_split_of_sum(ns):
    fn = answer(ns, "ring_reduce_scatter")
    cases = [(shape, dtype) for shape in SHAPES for dtype in DTYPES]
    for n in WORLD_SIZES:
        for rank, result in enumerate(_launch(_on_ranks_reduce_scatter, n, (fn, cases), "ring_reduce_scatter")):
            # Even splits first: a mistake that shows only on uneven ones is about the chunk sizes.
            for shape, dtype, out, expected, unchanged, ops, _ in sorted(result, key=lambda r: _numel(r[0]) % n != 0):
                where = _where(rank, shape, dtype, n)
                sizes = [c.numel() for c in torch.empty(_numel(shape)).tensor_split(n)]
                uneven = (f" (an uneven split: torch.tensor_split gives chunks of {sizes} elements, the first ones "
                          "one larger; no padding, no equal sizes)") if _numel(shape) % n else ""
                _assert_same_values(out, expected, where,
                                    f"the result (chunk {rank} of torch.tensor_split(sum.flatten(), {n})){uneven}")
                assert unchanged, f"{where}: ring_reduce_scatter must not modify its input; work on a copy"
                _assert_point_to_point(ops, where, "ring_reduce_scatter")


@public_check("2.2")
def reduce_scatter_sends_n_minus_1_over_n(ns):
    fn = answer(ns, "ring_reduce_scatter")
    for n in BYTES_WORLD_SIZES:
        results = _launch(_on_ranks_reduce_scatter, n, (fn, [((BYTES_NUMEL,), "float32")]), "ring_reduce_scatter")
        sent = [result[0][-1] for result in results]
        _assert_wire_bytes(sent, BYTES_NUMEL, 4, (n - 1) / n, "reduce-scatter")
