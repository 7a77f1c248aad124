"""Checks of lab 3.3: average_gradients, one flat all-reduce of the trainable gradients."""
import torch
import torch.distributed as dist
import torch.nn as nn

from helpers.comm import CommLedger
from helpers.grading.checks.lab03.common import TOL, WORLD_SIZE, _launch, _max_diff, _memoized
from helpers.grading.registry import answer, public_check
from helpers.grading.shared_run import RunFailed, definitions, run_failed

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


def _average_on_rank(average_gradients, drop=True):
    """Runs on every rank: the same model, different data, then the student's average_gradients.

    drop: rank 1's 4.bias.grad is None, as if its forward had not used the parameter.
    """
    rank = dist.get_rank()
    model = _frozen_model()
    x = torch.randn(6 + rank, 4, generator=torch.Generator().manual_seed(10 + rank))  # different data and sizes
    model(x).square().mean().backward()
    if rank == 1 and drop:
        model[4].bias.grad = None
    before, params = _grads(model), {n: p.detach().clone() for n, p in model.named_parameters()}
    with CommLedger() as ledger:
        average_gradients(model)
    moved = [n for n, p in model.named_parameters() if not torch.equal(p.detach(), params[n])]
    return before, _grads(model), moved, [(r.op, r.payload_bytes, r.numel) for r in ledger.records]


SKIPPED = ("rank 1, the one rank where 4.bias.grad is None, skipped that parameter, so its all-reduce no longer "
           "matches the other ranks' (count a missing .grad as zeros, in one buffer of the same size on every rank)")


def _run_3_3(fn):
    """Two runs: every rank with every gradient, then rank 1 without one. A failure of the second names the causes
    the first shows too: the student's loop usually has several mistakes at once (chapter 03's loop has three)."""
    every = _launch(_average_on_rank, fn, False, hang_timeout=10.0, hint="every rank must issue the same "
                    "collectives, with buffers of the same size. ")
    try:
        return _launch(_average_on_rank, fn, True, hang_timeout=10.0, hint=SKIPPED + ". ")
    except RunFailed as exc:
        causes = [SKIPPED] + _causes(every, drop=False)
        raise run_failed(exc.error, _join(causes) + ". ") from None


def _average_results(ns):
    fn = answer(ns, "average_gradients")
    return _memoized("3.3", definitions(ns), lambda: _run_3_3(fn))


def _expected_mean(results, name):
    grads = [before[name] if before[name] is not None else torch.zeros_like(results[0][0][name])
             for before, *_ in results]
    return torch.stack(grads).mean(dim=0)


def _join(causes):
    return causes[0] if len(causes) == 1 else "; ".join(causes[:-1]) + "; and " + causes[-1]


def _causes(results, drop=True):
    """What the gradients after the call show the student did wrong, most common mistakes first."""
    causes = []
    moved = sorted({n for _, _, moved, _ in results for n in moved})
    if moved:
        causes.append(f"average_gradients changed the parameters {moved}: average the gradients (p.grad), never "
                      "the parameters (the picotron hook bug)")
    names = ("2.weight", "2.bias", "4.weight") if drop else ("2.weight", "2.bias", "4.weight", UNUSED_ON_RANK_1)
    total = own = 0
    for before, after, _, _ in results:
        for name in names:
            got, expected = after[name], _expected_mean(results, name)
            total += got is not None and torch.allclose(got, WORLD_SIZE * expected, atol=TOL)
            own += got is not None and torch.equal(got, before[name])
    if total:
        causes.append(f"the gradients are the SUM over the {WORLD_SIZE} ranks: divide by the world size to get the "
                      "mean")
    elif own == len(results) * len(names):
        causes.append(".grad is still each rank's own gradient: copy the averaged buffer back into the "
                      "parameters' .grad")
    if drop and results[1][1][UNUSED_ON_RANK_1] is None:
        causes.append(f"{UNUSED_ON_RANK_1}.grad stayed None on rank 1, where it had no gradient: count it as zeros "
                      "and give it the mean like the others")
    return causes


@public_check("3.3")
def gradients_become_the_mean_over_ranks(ns):
    results = _average_results(ns)
    causes = _causes(results)
    assert not causes, _join(causes)
    for rank, (before, after, moved, _) in enumerate(results):
        for name in ("2.weight", "2.bias", "4.weight"):
            expected = _expected_mean(results, name)
            got = after[name]
            assert got is not None, f"rank {rank}: {name}.grad is None after the call"
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
        # The sum is the more common mistake: blame the division, not the zeros.
        assert not torch.allclose(got, WORLD_SIZE * expected, atol=TOL), (
            f"rank {rank}: {UNUSED_ON_RANK_1}.grad is the SUM over the {WORLD_SIZE} ranks; divide by the world size")
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
