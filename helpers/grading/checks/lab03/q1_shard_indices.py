"""Checks of lab 3.1: shard_indices against torch's DistributedSampler."""
import itertools

from helpers.grading.checks.lab03.common import _sampler_indices
from helpers.grading.registry import answer, public_check

# --- 3.1 shard_indices --------------------------------------------------------------------------

def _shape(num_samples, world_size, drop_last, order):
    """The order cut (drop_last) or padded by wrapping around, to a multiple of world_size: the sampler's rule."""
    if drop_last:
        return order[: num_samples // world_size * world_size]
    total = -(-num_samples // world_size) * world_size
    while len(order) < total:
        order = order + order[: total - len(order)]
    return order


def _diagnose(got, num_samples, rank, world_size, shuffle, seed, epoch, drop_last):
    """The mistake that gives `got`, and its fix; None if it is none of the usual ones. No value of the right answer
    is in it: the grader says it too, for the hidden tests' calls (helpers/grading/probes/lab03.py)."""
    order = _sampler_indices(num_samples, 0, 1, shuffle, seed, epoch, False)  # the epoch's whole order
    total = -(-num_samples // world_size) * world_size
    if not drop_last and total > 2 * num_samples and got == (order + order[: total - num_samples])[rank::world_size]:
        return ("with fewer samples than ranks, padding once is not enough: keep wrapping around the order from "
                "its start until its length is a multiple of world_size")
    if got == order[rank::world_size] and not drop_last:
        return ("the padding is missing: with drop_last=False repeat the order from its start until every rank "
                "has ceil(num_samples / world_size) indices")
    if got == order[rank::world_size]:
        return ("the cut is missing: with drop_last=True drop the tail of the order first, so every rank has "
                "floor(num_samples / world_size) indices")
    shaped = _shape(num_samples, world_size, drop_last, order)
    per_rank = len(shaped) // world_size
    if got == shaped[rank * per_rank:(rank + 1) * per_rank]:
        return ("each rank took a contiguous block; DistributedSampler gives rank r every world_size-th index "
                "of the padded or cut order: order[rank::world_size]")
    if shuffle and epoch != 0:
        first = _shape(num_samples, world_size, drop_last, _sampler_indices(num_samples, 0, 1, True, seed, 0, False))
        if got == first[rank::world_size]:
            return ("the same order in every epoch: seed the permutation's generator with seed + epoch, "
                    "so that every epoch is shuffled anew")
    return None


def _compare_with_sampler(shard_indices, cases):
    """Assert shard_indices == DistributedSampler on every
    (num_samples, world_size, shuffle, seed, epoch, drop_last)."""
    for num_samples, world_size, shuffle, seed, epoch, drop_last in cases:
        for rank in range(world_size):
            call = (f"shard_indices({num_samples}, rank={rank}, world_size={world_size}, shuffle={shuffle}, "
                    f"seed={seed}, epoch={epoch}, drop_last={drop_last})")
            got = shard_indices(num_samples, rank, world_size, shuffle=shuffle, seed=seed, epoch=epoch,
                                drop_last=drop_last)
            expected = _sampler_indices(num_samples, rank, world_size, shuffle, seed, epoch, drop_last)
            assert got is not None, f"{call} returned None: return the list of indices"
            got = [int(i) for i in got]
            if got != expected:
                mistake = _diagnose(got, num_samples, rank, world_size, shuffle, seed, epoch, drop_last)
                mistake = f"{mistake}. " if mistake else ""
                raise AssertionError(f"{mistake}{call} returned {got}; DistributedSampler gives {expected}")


@public_check("3.1")
def even_split_matches_sampler(ns):
    cases = itertools.product((12, 24), (1, 2, 3, 4), (False,), (0,), (0,), (False, True))
    _compare_with_sampler(answer(ns, "shard_indices"), cases)


@public_check("3.1")
def padding_matches_sampler(ns):
    """drop_last=False on lengths that do not divide: repeat from the start up to ceil(len / N) per rank."""
    cases = itertools.product((10, 11, 29, 50), (3, 4), (False,), (0,), (0,), (False,))
    _compare_with_sampler(answer(ns, "shard_indices"), cases)


@public_check("3.1")
def drop_last_matches_sampler(ns):
    cases = itertools.product((10, 11, 29, 50), (3, 4), (False,), (0,), (0,), (True,))
    _compare_with_sampler(answer(ns, "shard_indices"), cases)


@public_check("3.1")
def shuffle_and_epochs_match_sampler(ns):
    """The permutation comes from a generator seeded with seed + epoch: same on every rank, new every epoch."""
    cases = itertools.product((10, 29), (2, 3), (True,), (0, 7), (0, 1, 4), (False, True))
    _compare_with_sampler(answer(ns, "shard_indices"), cases)


@public_check("3.1")
def datasets_smaller_than_world_size(ns):
    """1 or 2 samples on up to 7 ranks: padding wraps around the order more than once."""
    cases = itertools.product((1, 2, 3), (3, 5, 7), (False, True), (0,), (0, 1), (False, True))
    _compare_with_sampler(answer(ns, "shard_indices"), cases)


# Said by the check and by the grader (helpers/grading/probes/lab03.py) of a rank outside 0 .. world_size - 1.
RANK_REFUSED = "should raise ValueError (rank must be in 0 .. world_size - 1), as DistributedSampler does"


@public_check("3.1")
def rejects_a_bad_rank(ns):
    shard_indices = answer(ns, "shard_indices")
    for rank in (3, -1):
        try:
            shard_indices(10, rank, 3, shuffle=False, seed=0, epoch=0, drop_last=False)
        except ValueError:
            continue
        raise AssertionError(f"shard_indices(10, rank={rank}, world_size=3, ...) {RANK_REFUSED}")
