"""Shared pieces of lab 07's checks: world size, tolerance, the memoized launcher, the padded shard layout."""
import math

import torch

from helpers.errors import RankFailed
from helpers.grading.shared_run import SharedRun, launch_on_gloo, run_failed

WORLD_SIZE = 3
HANG_S = 20.0  # a check whose ranks wait longer than this reports CollectiveHang instead of hanging
# float32 parameters of size < 1 after a few AdamW steps: the same sums in another order (or Adam's formula written
# with other operations) differ by a few roundings of 2**-24 (about 6e-8); 1e-6 allows that and is far below any
# real bug (chapter 07, section 6 measures it, and the float64 run there shrinks it to 1e-16).
TOL = 1e-6

_memoized = SharedRun()  # one launch serves every check of a question

# Added to every seed of the checks' models, data and gradients: 0 here. The grader's hidden tests run the same rank
# functions with it set from their secret seed (on the ranks), and the checks themselves on their results with the
# same value (in the grader: probes/judges.by_public_checks), so the feedback says what the check says.
OFFSET = 0


def _launch(fn, *args, hint=""):
    """Run fn on WORLD_SIZE Gloo ranks; a hang or a dead rank becomes a failure that says what to look at."""
    return launch_on_gloo(fn, WORLD_SIZE, args, HANG_S, hint)


def _shared_launch(question, key, fn, on_rank, hint, torch_error, unpadded):
    """One memoized launch of on_rank(fn) for a question's checks; torch's size error becomes `unpadded`, which
    names the missing padding (an unpadded shard fails inside the collective, before any check can look)."""
    def run():
        try:
            return _launch(on_rank, fn, hint=hint)
        except RankFailed as exc:
            if torch_error not in str(exc):
                raise
            raise run_failed(exc, unpadded) from None

    return _memoized(question, key, run)


def _flat(tensors):
    return torch.cat([t.detach().reshape(-1) for t in tensors])


def _max_diff(a, b):
    return (a.double() - b.double()).abs().max().item()


def _padded_shard(flat, rank, world_size):
    """Rank's shard of `flat` padded with zeros to a multiple of world_size (the reference layout)."""
    size = math.ceil(flat.numel() / world_size)
    padded = torch.cat([flat, flat.new_zeros(size * world_size - flat.numel())])
    return padded.view(world_size, size)[rank]


def _ops(records):
    """[(op, payload bytes)] of a ledger's records, in order."""
    return [(r.op, r.payload_bytes) for r in records]
