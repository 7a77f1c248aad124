"""Checks of lab 3.3: average_gradients, one flat all-reduce of the trainable gradients."""
import torch
import torch.distributed as dist
import torch.nn as nn

from helpers.comm import CommLedger
from helpers.grading.checks.lab03.common import TOL, WORLD_SIZE, _launch, _max_diff, _memoized
from helpers.grading.registry import answer, public_check
from helpers.grading.shared_run import RunFailed, definitions, run_failed

# --- 3.3 average_gradients ----------------------------------------------------------------------

def _frozen_model(seed=0):
    """Layer 0 frozen (requires_grad=False); 53 trainable parameters in layers 2 and 4."""
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(4, 6), nn.Tanh(), nn.Linear(6, 5), nn.Tanh(), nn.Linear(5, 3))
    model[0].requires_grad_(False)
    return model


TRAINABLE_3_3 = 6 * 5 + 5 + 5 * 3 + 3
UNUSED_ON_RANK_1 = "4.bias"  # its .grad is None on rank 1 only


def _grads(model):
    return {n: (None if p.grad is None else p.grad.clone()) for n, p in model.named_parameters()}


def _average_on_rank(average_gradients, drop=True, seed=0):
    """Runs on every rank: the same model, different data, then the student's average_gradients.

    drop: rank 1's 4.bias.grad is None, as if its forward had not used the parameter.
    seed: the model's initialisation and the data (the grader's hidden test runs this with its secret seed).
    """
    rank = dist.get_rank()
    model = _frozen_model(seed)
    x = torch.randn(6 + rank, 4, generator=torch.Generator().manual_seed(seed + 10 + rank))  # different data, sizes
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
# What a first run (every gradient present) that did not finish says first (the grader's hidden test says it too).
HINT = "every rank must issue the same collectives, with buffers of the same size. "


def _run_3_3(fn):
    """Two runs: every rank with every gradient, then rank 1 without one. A failure of the second names the causes
    the first shows too: the student's loop usually has several mistakes at once (chapter 03's loop has three)."""
    every = _launch(_average_on_rank, fn, False, hang_timeout=10.0, hint=HINT)
    try:
        return _launch(_average_on_rank, fn, True, hang_timeout=10.0, hint=SKIPPED + ". ")
    except RunFailed as exc:
        raise run_failed(exc.error, skipped_causes(every) + ". ") from None


def skipped_causes(every):
    """Why the run with rank 1's missing .grad did not finish, and what the run with every gradient shows too."""
    return _join([SKIPPED] + _causes(every, drop=False))


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


def _not_the_mean(results):
    """(rank, name) of the first trainable .grad that is not the mean over ranks, None for every one right."""
    for rank, (_, after, _, _) in enumerate(results):
        for name in ("2.weight", "2.bias", "4.weight"):
            if after[name] is None or not torch.allclose(after[name], _expected_mean(results, name), atol=TOL):
                return rank, name
    return None


def _differs(results):
    for rank, (_, after, _, _) in enumerate(results[1:], start=1):
        for name, grad in after.items():
            if grad is not None and results[0][1][name] is not None and not torch.equal(grad, results[0][1][name]):
                return f"{name}.grad differs between rank 0 and rank {rank}"
    return None


def _frozen_touched(results):
    for rank, (_, after, _, _) in enumerate(results):
        for name in ("0.weight", "0.bias"):
            if after[name] is not None:
                return (f"rank {rank}: frozen parameter {name} (requires_grad=False) got a .grad; leave frozen "
                        "parameters out")
    return None


def _missing_not_zero(results):
    expected = _expected_mean(results, UNUSED_ON_RANK_1)  # rank 1 contributes zeros
    for rank, (_, after, _, _) in enumerate(results):
        got = after[UNUSED_ON_RANK_1]
        if got is None:
            return (f"rank {rank}: {UNUSED_ON_RANK_1}.grad is None; a trainable parameter with no gradient on this "
                    "rank counts as zeros and receives the mean like the others"), rank
        # The sum is the more common mistake: blame the division, not the zeros.
        if torch.allclose(got, WORLD_SIZE * expected, atol=TOL):
            return (f"rank {rank}: {UNUSED_ON_RANK_1}.grad is the SUM over the {WORLD_SIZE} ranks; divide by the "
                    "world size"), rank
        if not torch.allclose(got, expected, atol=TOL):
            return (f"rank {rank}: {UNUSED_ON_RANK_1}.grad should be (g_rank0 + 0 + g_rank2) / 3 (rank 1 had no "
                    "gradient)"), rank
    return None


def _not_one_flat(results):
    expected = 4 * TRAINABLE_3_3
    for rank, (*_, records) in enumerate(results):
        reduces = [r for r in records if r[0] == "all_reduce"]
        others = sorted({r[0] for r in records if r[0] != "all_reduce"})
        if others:
            return f"rank {rank}: average_gradients issued {others}; use one all_reduce only"
        if len(reduces) != 1:
            return (f"rank {rank}: {len(reduces)} all_reduce calls (payloads {[r[1] for r in reduces]} bytes); "
                    "flatten every trainable gradient into one buffer and all-reduce it once")
        if reduces[0][1] != expected:
            return (f"rank {rank}: the all_reduce carried {reduces[0][1]} bytes; expected {expected} = 4 bytes x "
                    f"{TRAINABLE_3_3} trainable parameters (frozen ones stay out of the buffer)")
    return None


def diagnose(every, drop):
    """The first mistake the checks below report, without a value of the right answer, or None; drop: the run with
    rank 1's missing .grad, None if it did not finish. The grader says the same of its hidden test's runs."""
    if drop is None:
        return f"the ranks did not finish together: {skipped_causes(every)}"
    causes = _causes(drop)
    if causes:
        return _join(causes)
    wrong = _not_the_mean(drop)
    if wrong:
        return f"rank {wrong[0]}: {wrong[1]}.grad is not the mean over ranks of the gradients"
    for why in (_differs(drop), _frozen_touched(drop), (_missing_not_zero(drop) or [None])[0], _not_one_flat(drop)):
        if why:
            return why
    return None


@public_check("3.3")
def gradients_become_the_mean_over_ranks(ns):
    results = _average_results(ns)
    causes = _causes(results)
    assert not causes, _join(causes)
    wrong = _not_the_mean(results)
    if wrong:
        rank, name = wrong
        got, expected = results[rank][1][name], _expected_mean(results, name)
        assert got is not None, f"rank {rank}: {name}.grad is None after the call"
        raise AssertionError(f"rank {rank}: {name}.grad is not the mean over ranks of the gradients "
                             f"(max error {_max_diff(got, expected):.3g})")


@public_check("3.3")
def identical_on_every_rank(ns):
    why = _differs(_average_results(ns))
    assert not why, why


@public_check("3.3")
def frozen_parameters_left_alone(ns):
    why = _frozen_touched(_average_results(ns))
    assert not why, why


@public_check("3.3")
def missing_gradient_counts_as_zero(ns):
    results = _average_results(ns)
    wrong = _missing_not_zero(results)
    if wrong and "should be" in wrong[0]:
        got, expected = results[wrong[1]][1][UNUSED_ON_RANK_1], _expected_mean(results, UNUSED_ON_RANK_1)
        raise AssertionError(f"{wrong[0]}; max error {_max_diff(got, expected):.3g}")
    assert not wrong, wrong and wrong[0]


@public_check("3.3")
def one_flat_all_reduce(ns):
    why = _not_one_flat(_average_results(ns))
    assert not why, why
