"""Checks of lab 2.1: exchange_with_neighbours, a tensor to and from both ring neighbours."""
import torch.distributed as dist

from helpers.comm import CommLedger
from helpers.grading.checks.lab02.common import (
    WORLD_SIZES,
    _assert_point_to_point,
    _assert_same_values,
    _launch,
    _rank_data,
    _traffic,
)
from helpers.grading.registry import answer, public_check

# --- 2.1 exchange_with_neighbours ------------------------------------------------------------------

def _on_ranks_exchange(fn, shape):
    rank = dist.get_rank()
    t = _rank_data(shape, "float32", rank)
    with CommLedger() as ledger:
        out = fn(t)
    return out, _traffic(ledger)[0]


@public_check("2.1")
def exchanges_with_both_neighbours(ns):
    fn = answer(ns, "exchange_with_neighbours")
    shape = (6,)
    for n in WORLD_SIZES:
        results = _launch(_on_ranks_exchange, n, (fn, shape), "exchange_with_neighbours")
        for rank, (out, ops) in enumerate(results):
            where = f"world size {n}, rank {rank}"
            assert isinstance(out, tuple) and len(out) == 2, (
                f"{where}: return a pair (from_left, from_right), got {type(out).__name__}")
            left, right = (rank - 1) % n, (rank + 1) % n
            _assert_same_values(out[0], _rank_data(shape, "float32", left), where,
                                f"from_left (rank {left}'s tensor)")
            _assert_same_values(out[1], _rank_data(shape, "float32", right), where,
                                f"from_right (rank {right}'s tensor)")
            _assert_point_to_point(ops, where, "exchange_with_neighbours")
