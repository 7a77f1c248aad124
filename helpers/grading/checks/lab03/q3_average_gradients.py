"""Checks of lab 3.3: average_gradients, one flat all-reduce of the trainable gradients."""
import torch
import torch.distributed as dist
import torch.nn as nn

from helpers.comm import CommLedger
from helpers.grading.checks.lab03.common import TOL, WORLD_SIZE, _launch, _max_diff, _memoized
from helpers.grading.registry import answer, public_check

# --- 3.3 average_gradients ----------------------------------------------------------------------

def _frozen_model():
    """Layer 0 frozen (requires_grad=False); 53 trainable parameters in layers 2 and 4."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 6), nn.Tanh(), nn.Linear(6, 5), nn.Tanh(), nn.Linear(5, 3))
    model[0].requires_grad_(False)
    return model


TRAINABLE_3_3 = 6 * 5 + 5 + 5 * 3 + 3
UNUSED_ON_RANK_1 = "4.bias"  # its .grad is None on rank 1 only


def _grads(model):
    return {n: (None if p.grad is None else p.grad.clone()) for n, p in model.named_parameters()}


def _average_on_rank(average_gradients):
    """Runs on every rank: the same model, different data, then the student's average_gradients."""
    rank = dist.get_rank()
    model = _frozen_model()
    x = torch.randn(6 + rank, 4, generator=torch.Generator().manual_seed(10 + rank))  # different data and sizes
    model(x).square().mean().backward()
    if rank == 1:
        model[4].bias.grad = None  # as if this rank's forward had not used the parameter
    before, params = _grads(model), {n: p.detach().clone() for n, p in model.named_parameters()}
    with CommLedger() as ledger:
        average_gradients(model)
    moved = [n for n, p in model.named_parameters() if not torch.equal(p.detach(), params[n])]
    return before, _grads(model), moved, [(r.op, r.payload_bytes, r.numel) for r in ledger.records]


def _average_results(ns):
    fn = answer(ns, "average_gradients")
    hint = ("Every rank must all-reduce a buffer of the same size: count a missing .grad as zeros instead of "
            "skipping the parameter. ")
    return _memoized("3.3", fn, lambda: _launch(_average_on_rank, fn, hang_timeout=10.0, hint=hint))


def _expected_mean(results, name):
    grads = [before[name] if before[name] is not None else torch.zeros_like(results[0][0][name])
             for before, *_ in results]
    return torch.stack(grads).mean(dim=0)


@public_check("3.3")
def gradients_become_the_mean_over_ranks(ns):
    results = _average_results(ns)
    for rank, (before, after, moved, _) in enumerate(results):
        assert not moved, (f"rank {rank}: average_gradients changed the parameters {moved}: average the "
                           "gradients (p.grad), never the parameters (the picotron hook bug)")
        for name in ("2.weight", "2.bias", "4.weight"):
            expected = _expected_mean(results, name)
            got = after[name]
            assert got is not None, f"rank {rank}: {name}.grad is None after the call"
            if torch.allclose(got, WORLD_SIZE * expected, atol=TOL):
                raise AssertionError(f"rank {rank}: {name}.grad is the SUM over the 3 ranks; divide by the "
                                     "world size to get the mean")
            if torch.equal(got, before[name]):
                raise AssertionError(f"rank {rank}: {name}.grad is still this rank's own gradient; copy the "
                                     "averaged buffer back into the parameters' .grad")
            assert torch.allclose(got, expected, atol=TOL), (
                f"rank {rank}: {name}.grad is not the mean over ranks of the gradients "
                f"(max error {_max_diff(got, expected):.3g})")


@public_check("3.3")
def identical_on_every_rank(ns):
    results = _average_results(ns)
    for rank, (_, after, _, _) in enumerate(results[1:], start=1):
        for name, grad in after.items():
            if grad is not None and results[0][1][name] is not None:
                assert torch.equal(grad, results[0][1][name]), f"{name}.grad differs between rank 0 and rank {rank}"


@public_check("3.3")
def frozen_parameters_left_alone(ns):
    for rank, (_, after, _, _) in enumerate(_average_results(ns)):
        for name in ("0.weight", "0.bias"):
            assert after[name] is None, (f"rank {rank}: frozen parameter {name} (requires_grad=False) got a "
                                         ".grad; leave frozen parameters out")


@public_check("3.3")
def missing_gradient_counts_as_zero(ns):
    results = _average_results(ns)
    expected = _expected_mean(results, UNUSED_ON_RANK_1)  # rank 1 contributes zeros
    for rank, (_, after, _, _) in enumerate(results):
        got = after[UNUSED_ON_RANK_1]
        assert got is not None, (f"rank {rank}: {UNUSED_ON_RANK_1}.grad is None; a trainable parameter with no "
                                 "gradient on this rank counts as zeros and receives the mean like the others")
        assert torch.allclose(got, expected, atol=TOL), (
            f"rank {rank}: {UNUSED_ON_RANK_1}.grad should be (g_rank0 + 0 + g_rank2) / 3 (rank 1 had no gradient); "
            f"max error {_max_diff(got, expected):.3g}")


@public_check("3.3")
def one_flat_all_reduce(ns):
    expected = 4 * TRAINABLE_3_3
    for rank, (*_, records) in enumerate(_average_results(ns)):
        reduces = [r for r in records if r[0] == "all_reduce"]
        others = sorted({r[0] for r in records if r[0] != "all_reduce"})
        assert not others, f"rank {rank}: average_gradients issued {others}; use one all_reduce only"
        assert len(reduces) == 1, (
            f"rank {rank}: {len(reduces)} all_reduce calls (payloads {[r[1] for r in reduces]} bytes); flatten "
            "every trainable gradient into one buffer and all-reduce it once")
        assert reduces[0][1] == expected, (
            f"rank {rank}: the all_reduce carried {reduces[0][1]} bytes; expected {expected} = 4 bytes x "
            f"{TRAINABLE_3_3} trainable parameters (frozen ones stay out of the buffer)")
