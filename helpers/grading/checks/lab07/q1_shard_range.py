"""Checks of lab 7.1: shard_range, ceil(numel / world_size) elements per shard, the padding on the last ranks."""
import math

from helpers.grading.registry import answer, public_check

# --- 7.1 shard_range ----------------------------------------------------------------------------

# (start, stop, pad) of every rank for the (numel, world_size) the checks below use, recorded; the sweep in
# shards_tile_the_flat_parameter checks every other size by the properties these have.
RANGES = {
    (12, 1): [(0, 12, 0)],
    (12, 2): [(0, 6, 0), (6, 12, 0)],
    (12, 3): [(0, 4, 0), (4, 8, 0), (8, 12, 0)],
    (12, 4): [(0, 3, 0), (3, 6, 0), (6, 9, 0), (9, 12, 0)],
    (385, 5): [(0, 77, 0), (77, 154, 0), (154, 231, 0), (231, 308, 0), (308, 385, 0)],
    (10, 3): [(0, 4, 0), (4, 8, 0), (8, 10, 2)],
    (10, 4): [(0, 3, 0), (3, 6, 0), (6, 9, 0), (9, 10, 2)],
    (385, 2): [(0, 193, 0), (193, 385, 1)],
    (385, 3): [(0, 129, 0), (129, 258, 0), (258, 385, 2)],
    (385, 4): [(0, 97, 0), (97, 194, 0), (194, 291, 0), (291, 385, 3)],
    (7, 6): [(0, 2, 0), (2, 4, 0), (4, 6, 0), (6, 7, 1), (7, 7, 2), (7, 7, 2)],
    (5, 4): [(0, 2, 0), (2, 4, 0), (4, 5, 1), (5, 5, 2)],
    (1, 3): [(0, 1, 0), (1, 1, 1), (1, 1, 1)],
    (2, 8): [(0, 1, 0), (1, 2, 0), (2, 2, 1), (2, 2, 1), (2, 2, 1), (2, 2, 1), (2, 2, 1), (2, 2, 1)],
    (9, 7): [(0, 2, 0), (2, 4, 0), (4, 6, 0), (6, 8, 0), (8, 9, 1), (9, 9, 2), (9, 9, 2)],
}


def _compare(shard_range, cases, why=""):
    for numel, world_size in cases:
        for rank, expected in enumerate(RANGES[numel, world_size]):
            call = f"shard_range({numel}, rank={rank}, world_size={world_size})"
            got = shard_range(numel, rank, world_size)
            assert got is not None, f"{call} returned None: return (start, stop, pad)"
            got = tuple(int(v) for v in got)
            if got != expected:
                hint = _diagnose(numel, rank, world_size, got) or (
                    f"every shard has ceil({numel} / {world_size}) = {math.ceil(numel / world_size)} elements of "
                    f"the padded flat parameter{why}")
                raise AssertionError(f"{call} returned {got}; expected {expected}: {hint}")


def _diagnose(numel, rank, world_size, got):
    """What the wrong (start, stop, pad) probably came from, and the fix; or ''. No number of the right answer: the
    grader says it of its hidden tests' calls too (probes/lab07.py)."""
    size, floor = math.ceil(numel / world_size), numel // world_size
    start, stop, pad = got
    if start > numel:
        return ("the shard starts past the end of the flat parameter (start > numel); a shard of padding only starts "
                "and stops at numel: clip it, start = min(rank * s, numel)")
    if got == (rank * floor, numel if rank == world_size - 1 else (rank + 1) * floor, 0):
        return ("that is a split into numel // world_size elements with the rest on the last rank; every shard has "
                "s = ceil(numel / world_size) elements, the last ones padded with zeros")
    if stop - start + pad == floor + 1 != size:
        return ("shards of numel // world_size + 1 elements, one too many when world_size divides numel; "
                "s = math.ceil(numel / world_size)")
    if pad == size * world_size - numel != size - (stop - start):
        return ("pad is the padding of the whole flat parameter (s * world_size - numel); this rank's own padding is "
                "what completes its shard: s - (stop - start)")
    return ""


# Said by the check and by the grader of a rank outside 0 .. world_size - 1.
RANK_REFUSED = "should raise ValueError (rank must be in 0 .. world_size - 1)"


@public_check("7.1")
def even_split(ns):
    _compare(answer(ns, "shard_range"), [(12, 1), (12, 2), (12, 3), (12, 4), (385, 5)])


@public_check("7.1")
def padding_goes_to_the_last_ranks(ns):
    _compare(answer(ns, "shard_range"), [(10, 3), (10, 4), (385, 2), (385, 3), (385, 4), (7, 6)],
             why=", and the padding zeros sit at the end of the flat parameter")


@public_check("7.1")
def ranks_with_only_padding(ns):
    """5 elements on 4 ranks: shards of 2, so rank 3 starts at element 6 > 5 and holds only padding."""
    _compare(answer(ns, "shard_range"), [(5, 4), (1, 3), (2, 8), (9, 7)],
             why="; a shard that starts past the last real element holds none (start == stop == numel)")


@public_check("7.1")
def shards_tile_the_flat_parameter(ns):
    shard_range = answer(ns, "shard_range")
    for numel in range(1, 40):
        for world_size in range(1, 9):
            ranges = [tuple(int(v) for v in shard_range(numel, rank, world_size)) for rank in range(world_size)]
            size = math.ceil(numel / world_size)
            assert all(stop - start + pad == size for start, stop, pad in ranges), (
                f"numel={numel}, world_size={world_size}: every shard must have {size} elements "
                f"(stop - start + pad); got {ranges}")
            covered = [i for start, stop, _ in ranges for i in range(start, stop)]
            assert covered == list(range(numel)), (
                f"numel={numel}, world_size={world_size}: the ranges {ranges} must cover 0 .. {numel - 1} once, "
                "in rank order")
            padded = [r for r, (start, stop, pad) in enumerate(ranges) if pad and not start <= stop == numel]
            assert not padded, (
                f"numel={numel}, world_size={world_size}: rank {padded[0]}'s shard {ranges[padded[0]]} holds padding, "
                f"so it holds the last real elements: start <= stop == numel = {numel} (a shard of padding only has "
                f"start == stop == numel); the zeros sit at the end of the flat parameter; got {ranges}")


@public_check("7.1")
def rejects_a_bad_rank(ns):
    shard_range = answer(ns, "shard_range")
    for rank in (3, -1):
        try:
            shard_range(10, rank, 3)
        except ValueError:
            continue
        raise AssertionError(f"shard_range(10, rank={rank}, world_size=3) {RANK_REFUSED}")
