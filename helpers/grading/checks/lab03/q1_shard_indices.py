"""Checks of lab 3.1: shard_indices against torch's DistributedSampler."""
import itertools

from helpers.grading.checks.lab03.common import _sampler_indices
from helpers.grading.registry import answer, public_check

# --- 3.1 shard_indices --------------------------------------------------------------------------

def _compare_with_sampler(shard_indices, cases):
    """Assert shard_indices == DistributedSampler on every (num_samples, world_size, shuffle, seed, epoch, drop_last)."""
    for num_samples, world_size, shuffle, seed, epoch, drop_last in cases:
        for rank in range(world_size):
            call = (f"shard_indices({num_samples}, rank={rank}, world_size={world_size}, shuffle={shuffle}, "
                    f"seed={seed}, epoch={epoch}, drop_last={drop_last})")
            got = shard_indices(num_samples, rank, world_size, shuffle=shuffle, seed=seed, epoch=epoch,
                                drop_last=drop_last)
            expected = _sampler_indices(num_samples, rank, world_size, shuffle, seed, epoch, drop_last)
            assert got is not None, f"{call} returned None: return the list of indices"
            got = [int(i) for i in got]
            assert got == expected, f"{call} returned {got}; DistributedSampler gives {expected}"


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


@public_check("3.1")
def rejects_a_bad_rank(ns):
    shard_indices = answer(ns, "shard_indices")
    for rank in (3, -1):
        try:
            shard_indices(10, rank, 3, shuffle=False, seed=0, epoch=0, drop_last=False)
        except ValueError:
            continue
        raise AssertionError(f"shard_indices(10, rank={rank}, world_size=3, ...) should raise ValueError "
                             "(rank must be in 0 .. world_size - 1), as DistributedSampler does")
