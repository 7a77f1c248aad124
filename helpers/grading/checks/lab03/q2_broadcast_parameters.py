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


def _broadcast_once(broadcast_parameters, src):
    """On this rank: different parameters and buffers, the student's broadcast, what it left."""
    rank = dist.get_rank()
    torch.manual_seed(rank)
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


def _broadcast_on_rank(broadcast_parameters):
    """Runs on every rank: a broadcast from rank 1, then one with the default src; one run for every check."""
    return {src: _broadcast_once(broadcast_parameters, src) for src in (1, None)}


def _broadcast_results(ns, src):
    fn = answer(ns, "broadcast_parameters")
    hint = ("every rank must call dist.broadcast for every tensor, with the same src: the source sends, the others "
            "receive into their own tensors. ")
    by_rank = _memoized("3.2", definitions(ns), lambda: _launch(_broadcast_on_rank, fn, hint=hint))
    return [runs[src] for runs in by_rank]


def _assert_copied_from(results, src, how):
    source = results[src][0]
    # Every rank ended with rank 0's tensors: the broadcast ignored src.
    if src != 0 and all(torch.equal(after[n], results[0][0][n]) for _, after, *_ in results for n in after):
        raise AssertionError(f"{how}: every rank ended with rank 0's parameters and buffers, not rank {src}'s: pass "
                             "src=src to dist.broadcast, not 0")
    for rank, (_, after, *_) in enumerate(results):
        for name, value in after.items():
            kind = "buffer" if name.split(".")[-1] in ("running_mean", "running_var", "num_batches_tracked") \
                else "parameter"
            hint = " (broadcast model.buffers() too, not only the parameters)" if kind == "buffer" else ""
            assert torch.equal(value, source[name]), (
                f"{how}: on rank {rank}, {kind} {name!r} is not rank {src}'s{hint}; "
                f"max difference {_max_diff(value.double(), source[name].double()):.3g}")


@public_check("3.2")
def parameters_and_buffers_come_from_src(ns):
    _assert_copied_from(_broadcast_results(ns, 1), 1, "broadcast_parameters(model, src=1) on 3 ranks")


@public_check("3.2")
def src_defaults_to_rank_0(ns):
    _assert_copied_from(_broadcast_results(ns, None), 0, "broadcast_parameters(model) on 3 ranks")


@public_check("3.2")
def in_place_same_objects(ns):
    for rank, (_, _, same_objects, trainable, _) in enumerate(_broadcast_results(ns, 1)):
        assert same_objects, (f"rank {rank}: the model's parameter or buffer objects were replaced; copy into "
                              "them in place (dist.broadcast(tensor, src) writes into tensor) so an optimizer "
                              "built earlier still holds the model's parameters")
        assert trainable, f"rank {rank}: parameters must stay trainable leaves (requires_grad=True, no grad_fn)"


@public_check("3.2")
def outside_autograd(ns):
    for rank, (*_, recorded) in enumerate(_broadcast_results(ns, 1)):
        assert not recorded, (f"rank {rank}: autograd recorded {recorded[0]} on the parameters and warned in the "
                              "next backward(); broadcast under torch.no_grad() (or broadcast p.detach())")
