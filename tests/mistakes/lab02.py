"""Lab 02 (collectives from point-to-point): chapter 02's naive versions and the tutorial bugs, as 2.1 to 2.5 see them.

The wrong answers are the ones tests/test_lab02_checks.py already holds; here each is held to its first line.
"""
from helpers.grading.labgen import ROOT
from tests import test_lab02_checks as wrong
from tests.mistakes import Mistake

SOLUTION = ROOT / "solutions" / "02_collectives.ipynb"

MISTAKES = [
    Mistake("2.1", "blocking send before recv on every rank", wrong.BLOCKING_EXCHANGE,
            ("hung", "dist.isend/dist.irecv"), run_fails=True),
    Mistake("2.1", "neighbours swapped", wrong.SWAPPED_EXCHANGE, ("from_left",)),
    Mistake("2.1", "dist.all_gather instead of point-to-point", '''
def exchange_with_neighbours(t):
    rank, n = dist.get_rank(), dist.get_world_size()
    everyone = [torch.empty_like(t) for _ in range(n)]
    dist.all_gather(everyone, t)
    return everyone[(rank - 1) % n], everyone[(rank + 1) % n]
''', ("all_gather", "point-to-point")),
    Mistake("2.2", "chapter 02's schedule unchanged: keeps the wrong chunk", wrong.WRONG_CHUNK_REDUCE_SCATTER,
            ("chunk 0 of",)),
    Mistake("2.2", "pads to a multiple of N: padding on the wire", wrong.PADDED_REDUCE_SCATTER, ("no padding",)),
    Mistake("2.3", "stores each arriving chunk one place off", wrong.SHIFTED_ALL_GATHER,
            ("every rank's chunk, in rank order",)),
    Mistake("2.3", "dist.all_gather", wrong.GATHER_WITH_TORCH, ("called all_gather", "point-to-point")),
    Mistake("2.4", "the whole tensor round the ring (the tutorial bug)", wrong.UNCHUNKED_RING,
            ("whole tensor passed round the ring",)),
    Mistake("2.4", "naive: everyone to rank 0 and back", wrong.NAIVE_ALL_REDUCE, ("a root that sends it",)),
    Mistake("2.4", "dist.all_reduce", wrong.TORCH_ALL_REDUCE, ("called all_reduce", "point-to-point")),
    Mistake("2.4", "returns the sum but leaves tensor unchanged", wrong.NOT_IN_PLACE, ("in place",)),
    Mistake("2.5", "averages the parameters (the picotron bug)", wrong.AVERAGE_PARAMETERS, ("not the parameters",)),
    Mistake("2.5", "sum without the division", wrong.SUM_NOT_MEAN, ("divided by the world size",)),
    Mistake("2.5", "one ring_all_reduce per parameter", wrong.PER_PARAMETER, ("call ring_all_reduce once",)),
]
