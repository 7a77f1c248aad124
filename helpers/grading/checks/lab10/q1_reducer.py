"""Checks of lab 10.1: the GPT trained with the student's lab 04 Reducer, against torch DDP."""
from helpers.grading.checks.lab10.common import (
    WORLD_SIZE,
    equal_to_torch,
    identical_parameters_from_different_data,
    per_step,
    runs,
)
from helpers.grading.registry import public_check

WHAT = "return the class itself: end bring_reducer with `return Reducer`"
HINT = ("Every rank must launch the same all-reduces in the same order: one per bucket, from the hooks, and "
        "finalize() must wait for every one. ")


def _runs(ns):
    return runs(ns, "10.1", "reducer", "bring_reducer", lambda c: isinstance(c, type), WHAT, hint=HINT)


@public_check("10.1")
def different_data_identical_parameters(ns):
    mine, _ = _runs(ns)
    identical_parameters_from_different_data(mine, "finalize() must wait for every bucket's all-reduce and copy "
                                                   "the mean back into every p.grad before the optimizer steps")


@public_check("10.1")
def one_all_reduce_per_bucket(ns):
    """Only all-reduces in a step, one per bucket, covering every gradient byte: 2 (N-1)/N x 4 psi on the wire."""
    mine, _ = _runs(ns)
    psi = mine[0]["params"].numel()
    buckets = mine[0]["layout"]["buckets"]
    for rank, step, ops in per_step(mine):
        where = f"rank {rank}, step {step}"
        assert "all_reduce" in ops, (f"{where}: your Reducer issued no all-reduce during the step (ledger: "
                                     f"{sorted(ops) or 'nothing'}); the hooks must launch each bucket's all-reduce")
        others = sorted(set(ops) - {"all_reduce"})
        assert not others, f"{where}: your step also issued {others}; a Reducer only all-reduces its buckets"
        calls = ops["all_reduce"]["calls"]
        assert calls == buckets, (f"{where}: {calls} all-reduces for your {buckets} buckets; launch each bucket "
                                  "once, when its last gradient arrives")
        payload = ops["all_reduce"]["payload_bytes"]
        assert payload == 4 * psi, (f"{where}: your buckets all-reduced {payload} bytes, the GPT's gradients are "
                                    f"4 x {psi} = {4 * psi} bytes; every parameter must be in exactly one bucket")
        ring = 2 * (WORLD_SIZE - 1) / WORLD_SIZE * payload
        assert abs(ops["all_reduce"]["wire_bytes"] - ring) <= calls, f"{where}: wire bytes are not the ring's"


@public_check("10.1")
def equals_torch_ddp(ns):
    mine, theirs = _runs(ns)
    equal_to_torch(mine, theirs, "torch DDP",
                   grads_hint="copy param.grad (not param) into the bucket, and the averaged buffer back",
                   params_hint="finalize() before optimizer.step(), every step")
