"""Checks of lab 3.2: broadcast_parameters copies parameters and buffers from src, in place, outside autograd."""
import itertools
import warnings

import torch
import torch.distributed as dist
import torch.nn as nn

from helpers.grading.checks.lab03.common import _launch, _max_diff, _memoized
from helpers.grading.registry import answer, public_check
from helpers.grading.shared_run import definitions

# --- 3.2 broadcast_parameters -------------------------------------------------------------------

def _bn_model():
    """Parameters and buffers, including BatchNorm's int64 num_batches_tracked."""
    return nn.Sequential(nn.Linear(4, 6), nn.BatchNorm1d(6), nn.Tanh(), nn.Linear(6, 2))


def _broadcast_once(broadcast_parameters, src, seed=0):
    """On this rank: different parameters and buffers, the student's broadcast, what it left."""
    rank = dist.get_rank()
    torch.manual_seed(seed + rank)
    model = _bn_model()
    for _ in range(rank + 1):  # different running statistics and num_batches_tracked on every rank
        model(torch.randn(5, 4))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    objects = [id(t) for t in itertools.chain(model.parameters(), model.buffers())]
    if src is None:
        broadcast_parameters(model)
    else:
        broadcast_parameters(model, src=src)
    after = {k: v.clone() for k, v in model.state_dict().items()}
    same_objects = objects == [id(t) for t in itertools.chain(model.parameters(), model.buffers())]
    trainable = all(p.requires_grad and p.is_leaf for p in model.parameters())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model(torch.randn(5, 4)).sum().backward()
    recorded = [str(w.message).split(": an autograd")[0] for w in caught
                if "autograd kernel was not registered" in str(w.message)]
    return before, after, same_objects, trainable, recorded


def _broadcast_on_rank(broadcast_parameters, seed=0):
    """Runs on every rank: a broadcast from rank 1, then one with the default src; one run for every check.

    seed: the models' initialisation (the grader's hidden test runs this with its secret seed)."""
    return {src: _broadcast_once(broadcast_parameters, src, seed) for src in (1, None)}


# What a run that did not finish says first (the grader's hidden test says it too).
HINT = ("every rank must call dist.broadcast for every tensor, with the same src: the source sends, the others receive "
        "into their own tensors. ")


def _broadcast_results(ns, src):
    fn = answer(ns, "broadcast_parameters")
    by_rank = _memoized("3.2", definitions(ns), lambda: _launch(_broadcast_on_rank, fn, hint=HINT))
    return [runs[src] for runs in by_rank]


def _not_copied(results, src, how):
    """(the mistake, its rank, its tensor's name) of a broadcast that did not copy rank src's tensors, or None."""
    source = results[src][0]
    # Every rank ended with rank 0's tensors: the broadcast ignored src.
    if src != 0 and all(torch.equal(after[n], results[0][0][n]) for _, after, *_ in results for n in after):
        return (f"{how}: every rank ended with rank 0's parameters and buffers, not rank {src}'s: pass src=src to "
                "dist.broadcast, not 0"), None, None
    for rank, (_, after, *_) in enumerate(results):
        for name, value in after.items():
            kind = "buffer" if name.split(".")[-1] in ("running_mean", "running_var", "num_batches_tracked") \
                else "parameter"
            hint = " (broadcast model.buffers() too, not only the parameters)" if kind == "buffer" else ""
            if not torch.equal(value, source[name]):
                return f"{how}: on rank {rank}, {kind} {name!r} is not rank {src}'s{hint}", rank, name
    return None


def _assert_copied_from(results, src, how):
    wrong = _not_copied(results, src, how)
    if wrong and wrong[1] is None:
        raise AssertionError(wrong[0])
    if wrong:
        (mistake, rank, name), source = wrong, results[src][0]
        value = results[rank][1][name]
        raise AssertionError(f"{mistake}; max difference {_max_diff(value.double(), source[name].double()):.3g}")


def _replaced(results):
    for rank, (_, _, same_objects, trainable, _) in enumerate(results):
        if not same_objects:
            return (f"rank {rank}: the model's parameter or buffer objects were replaced; copy into them in place "
                    "(dist.broadcast(tensor, src) writes into tensor) so an optimizer built earlier still holds the "
                    "model's parameters")
        if not trainable:
            return f"rank {rank}: parameters must stay trainable leaves (requires_grad=True, no grad_fn)"
    return None


def _recorded(results):
    for rank, (*_, recorded) in enumerate(results):
        if recorded:
            return (f"rank {rank}: autograd recorded {recorded[0]} on the parameters and warned in the next "
                    "backward(); broadcast under torch.no_grad() (or broadcast p.detach())")
    return None


def diagnose(by_src):
    """The first mistake the checks below report for {src: per-rank results} ({1: ..., None: ...}), without a value
    of the right answer, or None. The grader says the same of its hidden test's run (probes/lab03.py)."""
    for why in (_not_copied(by_src[1], 1, "broadcast_parameters(model, src=1) on 3 ranks"),
                _not_copied(by_src[None], 0, "broadcast_parameters(model) on 3 ranks"),
                _replaced(by_src[1]), _recorded(by_src[1])):
        if why:
            return why if isinstance(why, str) else why[0]
    return None


@public_check("3.2")
def parameters_and_buffers_come_from_src(ns):
    _assert_copied_from(_broadcast_results(ns, 1), 1, "broadcast_parameters(model, src=1) on 3 ranks")


@public_check("3.2")
def src_defaults_to_rank_0(ns):
    _assert_copied_from(_broadcast_results(ns, None), 0, "broadcast_parameters(model) on 3 ranks")


@public_check("3.2")
def in_place_same_objects(ns):
    why = _replaced(_broadcast_results(ns, 1))
    assert not why, why


@public_check("3.2")
def outside_autograd(ns):
    why = _recorded(_broadcast_results(ns, 1))
    assert not why, why
