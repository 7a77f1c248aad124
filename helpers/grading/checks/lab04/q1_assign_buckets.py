"""Checks of lab 4.1: assign_buckets gives torch's buckets (dist._compute_bucket_assignment_by_size)."""
import torch
import torch.distributed as dist

from helpers.grading.checks.lab04.common import CAP_BYTES, make_model, nbytes, torch_buckets
from helpers.grading.registry import answer, public_check


# ------------------------------------------------------------------------------------------------ question 4.1
def _assignment_cases():
    mlp = list(make_model(0).parameters())
    half = [torch.empty(n, dtype=torch.float16) for n in (100, 3, 50, 7, 64)]
    return [("the lab MLP, cap 400 B", mlp, CAP_BYTES), ("cap 1 B: every tensor alone", mlp, 1),
            ("cap 1 GB: one bucket", mlp, 10**9), ("four 16-byte tensors, cap 32 B", [torch.empty(4)] * 4, 32),
            ("float16 tensors (2 bytes each), cap 100 B", half, 100)]


def _wrong_assignments(params, cap):
    """{mistake: the assignment it gives}; the first two are torch's rule fed what the mistake feeds it."""
    n = len(params)
    forward = dist._compute_bucket_assignment_by_size(list(params), [cap], [], list(range(n)))[0]
    as_bytes = [torch.empty(p.numel(), dtype=torch.uint8) for p in params]  # one byte per element: numel as bytes
    sizes = [nbytes(p) for p in params]
    strict, current, filled = [], [], 0
    for index in reversed(range(n)):
        if current and filled + sizes[index] > cap:
            strict.append(current)
            current, filled = [], 0
        current.append(index)
        filled += sizes[index]
    strict += [current] if current else []
    return {"grouped from the FIRST parameter: gradients arrive last-layer first, so start from the last one":
                [list(b) for b in forward],
            "counted elements, not bytes: the cap is in bytes, p.numel() * p.element_size()":
                torch_buckets(as_bytes, cap),
            "kept every bucket under the cap: torch closes a bucket at the first tensor that takes it to >= cap "
            "(so a bucket may exceed the cap by part of one tensor)": strict}


def diagnose(got, params, cap):
    """The mistake an assignment that is not torch's shows, and its fix, or None (the grader says it too)."""
    wrong = next((f"You {name}." for name, wrong in _wrong_assignments(params, cap).items() if got == wrong), None)
    if not wrong and sorted(map(sorted, got)) == sorted(map(sorted, torch_buckets(params, cap))):
        wrong = "Same buckets, another order: list buckets and the indices inside them in gradient-arrival order."
    return wrong


@public_check("4.1")
def same_buckets_as_torch(ns):
    fn = answer(ns, "assign_buckets")
    for label, params, cap in _assignment_cases():
        expected = torch_buckets(params, cap)
        got = fn(list(params), cap)
        try:
            got = [[int(i) for i in b] for b in got]
        except TypeError:
            raise AssertionError(f"{label}: expected a list of lists of parameter indices, got {got!r}") from None
        if got == expected:
            continue
        hint = diagnose(got, params, cap)
        hint = f" {hint}" if hint else ""
        raise AssertionError(f"{label} (sizes {[nbytes(p) for p in params]} bytes): expected {expected} "
                             f"(torch's _compute_bucket_assignment_by_size), got {got}.{hint}")


@public_check("4.1")
def every_parameter_exactly_once(ns):
    fn = answer(ns, "assign_buckets")
    params = [torch.empty(n) for n in (5, 300, 1, 1, 77, 12, 40)]
    got = fn(params, 64)
    seen = sorted(int(i) for b in got for i in b)
    assert seen == list(range(len(params))), (
        f"7 parameters: every index 0..6 must appear in exactly one bucket; the buckets hold {sorted(seen)}")
    assert all(len(b) for b in got), f"empty bucket in {got}"
