"""Shared pieces of lab 03's checks: world size, tolerance, the memoized launcher, the sampler's indices."""
from torch.utils.data import DistributedSampler

from helpers.grading.shared_run import SharedRun, launch_on_gloo

WORLD_SIZE = 3  # odd on purpose: 29 samples do not split evenly
HANG_S = 20.0  # a check whose ranks wait longer than this reports CollectiveHang instead of hanging
# float32 parameters of size <= 1 after a few SGD steps: sums taken in another order differ by a few
# roundings of 2**-24 (about 6e-8); 1e-6 allows that and is far below any real bug (chapter 03, section 6).
TOL = 1e-6

_memoized = SharedRun()  # one launch serves every check of a question


def _launch(fn, *args, hang_timeout=HANG_S, hint=""):
    """Run fn on WORLD_SIZE Gloo ranks; a hang or a crashed rank becomes a failure that says what to look at."""
    return launch_on_gloo(fn, WORLD_SIZE, args, hang_timeout, hint)


def _max_diff(a, b):
    return (a - b).abs().max().item()


def _sampler_indices(num_samples, rank, world_size, shuffle, seed, epoch, drop_last):
    sampler = DistributedSampler(range(num_samples), num_replicas=world_size, rank=rank, shuffle=shuffle,
                                 seed=seed, drop_last=drop_last)
    sampler.set_epoch(epoch)
    return list(sampler)
