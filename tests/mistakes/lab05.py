"""Lab 05 (accumulation and scaling): no_sync misused, micro-batch weights, the step-time model's usual errors.

The wrong answers are the ones tests/test_lab05_checks.py already builds (functions, shipped to the ranks by value).
"""
from helpers.grading.prepare.labgen import ROOT
from tests import test_lab05_checks as wrong
from tests.mistakes import Mistake

SOLUTION = ROOT / "solutions" / "05_accumulation_and_scaling.ipynb"


def _accumulate(*args, **kwargs):
    return {"accumulate_and_step": wrong.accumulate(*args, **kwargs)}


MISTAKES = [
    # Ranks with 3, 2 and 1 micro-batches then issue different numbers of all-reduces: the run hangs first.
    Mistake("5.1", "no no_sync: all-reduce at every micro-batch", _accumulate(wrong.no_no_sync),
            ("an all-reduce at every micro-batch", "inside no_sync() (forward and backward)"), run_fails=True),
    Mistake("5.1", "no_sync around the backward only", _accumulate(wrong.backward_only),
            ("no_sync() around the backward only", "inside no_sync() (forward and backward)"), run_fails=True),
    Mistake("5.1", "the last micro-batch inside no_sync too", _accumulate(wrong.everything_in_no_sync),
            ("no all-reduce at all",)),
    Mistake("5.1", "losses divided by the number of micro-batches", _accumulate(wrong.right, weighting="count"),
            ("divided by the number of micro-batches",)),
    Mistake("5.1", "losses not scaled", _accumulate(wrong.right, weighting="none"), ("were not scaled",)),
    Mistake("5.1", "no optimizer.zero_grad()", _accumulate(wrong.right, zero_grad=False), ("optimizer.zero_grad()",)),
    Mistake("5.2", "every bucket of bucket_cap_bytes (no small first bucket)",
            {"predict_step_time": wrong.predictor(buckets="equal")}, ("first bucket holds only first_bucket_bytes",)),
    Mistake("5.2", "one bucket", {"predict_step_time": wrong.predictor(buckets="one")},
            ("cut the gradient bytes into buckets",)),
    Mistake("5.2", "the unchunked ring", {"predict_step_time": wrong.predictor(op="unchunked_ring_all_reduce")},
            ("unchunked ring",)),
    Mistake("5.2", "overlap ignored", {"predict_step_time": wrong.predictor(overlap_rule="ignored")},
            ("step = compute_s + max(0, comm - overlap * compute_s)",)),
    Mistake("5.2", "full overlap: max(compute, comm)", {"predict_step_time": wrong.predictor(overlap_rule="max")},
            ("only a fraction `overlap`",)),
    Mistake("5.3", "strided shards", {"micro_batches_of_rank": wrong.strided}, ("rank r keeps rows",)),
    Mistake("5.3", "no ValueError on an uneven batch", {"micro_batches_of_rank": wrong.no_check},
            ("expected ValueError on every rank",)),
    Mistake("5.3", "the same data on every rank", {"micro_batches_of_rank": wrong.same_data_everywhere},
            ("rank r keeps rows",)),
]
