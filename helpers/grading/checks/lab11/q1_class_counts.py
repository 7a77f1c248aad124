"""Checks of lab 11.1: class_counts, the planted bincount whose length depends on the rank's data."""
import torch
import torch.distributed as dist

from helpers.backend import rank_device
from helpers.grading.checks.lab11.common import HANG_S, WORLD_SIZE, _memoized
from helpers.grading.registry import answer, public_check
from helpers.grading.shared_run import definitions, run_failed

NUM_CLASSES = 6
# Rank 0 sees every class, rank 1 never the last two, rank 2 has no samples at all: three different bincount lengths.
LABELS = ([0, 5, 2, 2, 1, 3, 4, 5, 0], [1, 0, 3, 3, 2, 1], [])

_HINT_SHAPE = ("the ranks' all_reduce calls differ in shape: torch.bincount(labels) is as long as the rank's "
               "largest label + 1: pass minlength=num_classes, so every rank sends num_classes counts. ")


def _count_on_rank(class_counts):
    labels = torch.tensor(LABELS[dist.get_rank()], dtype=torch.int64, device=rank_device())
    counts = class_counts(labels, NUM_CLASSES)
    return counts.cpu() if isinstance(counts, torch.Tensor) else counts


def _results(ns):
    from helpers.errors import CollectiveHang, CollectiveMismatch, RankFailed
    from helpers.grading.shared_run import launch_gloo as launch  # starts no ranks for a TODO

    fn = answer(ns, "class_counts")

    def run():
        try:  # check_collectives: a mismatch is named before Gloo crashes on it
            return launch(_count_on_rank, WORLD_SIZE, args=(fn,), backend="gloo", hang_timeout=HANG_S,
                          check_collectives=True)
        except CollectiveMismatch as exc:
            raise run_failed(exc, _HINT_SHAPE) from None
        except (CollectiveHang, RankFailed) as exc:
            if isinstance(exc, RankFailed) and exc.exitcode is None:
                raise
            raise run_failed(exc, "every rank must call dist.all_reduce once, with the same shape. ") from None

    return _memoized("11.1", definitions(ns), run)


def _expected():
    return torch.bincount(torch.tensor([v for labels in LABELS for v in labels]), minlength=NUM_CLASSES)


@public_check("11.1")
def global_counts_on_every_rank(ns):
    expected = _expected()
    local = [torch.bincount(torch.tensor(labels, dtype=torch.int64), minlength=NUM_CLASSES) for labels in LABELS]
    for rank, counts in enumerate(_results(ns)):
        assert isinstance(counts, torch.Tensor), f"rank {rank} returned {type(counts).__name__}; return the tensor"
        assert counts.shape == (NUM_CLASSES,), (f"rank {rank} returned shape {tuple(counts.shape)}; expected "
                                                f"({NUM_CLASSES},): pass minlength=num_classes to torch.bincount")
        if torch.equal(counts.double(), expected.double()):
            continue
        if torch.equal(counts.double(), local[rank].double()):
            raise AssertionError(f"rank {rank} returned its own counts {counts.tolist()}, not the total over ranks "
                                 f"{expected.tolist()}: all_reduce them (SUM) before returning")
        if any(torch.allclose(counts.double(), divided) for divided in  # a true or a floor division
               (expected.double() / WORLD_SIZE, (expected // WORLD_SIZE).double())):
            raise AssertionError(f"rank {rank}'s counts are divided by the world size ({WORLD_SIZE}): counts over "
                                 "ranks are a SUM: drop the division")
        if torch.equal(counts.double(), torch.stack(local).max(0).values.double()):
            raise AssertionError(f"rank {rank} returned the per-class MAX over ranks {counts.tolist()}: counts "
                                 "over ranks are a SUM: op=dist.ReduceOp.SUM (the default)")
        raise AssertionError(f"rank {rank} returned {counts.tolist()}; the counts over all ranks are "
                             f"{expected.tolist()}")


@public_check("11.1")
def counts_are_exact_integers(ns):
    for rank, counts in enumerate(_results(ns)):
        assert counts.dtype == torch.int64, (f"rank {rank}'s counts are {counts.dtype}: a float32 count is exact "
                                             "only up to 2**24 samples: keep torch.bincount's int64")
