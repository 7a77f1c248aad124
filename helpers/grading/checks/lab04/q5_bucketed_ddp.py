"""Checks of lab 4.5: BucketedDDP wraps the model as torch DDP does, refuses a step begun before the last one was
synchronized, and trains like torch DDP and like one process (the lab's last check).

One launch on 3 ranks serves every check (4.4 already trains on 2 and 3; a launch here costs about 10 CPU-seconds):
the ranks build the wrapper, try it, provoke the refusal on a second model, then train a third next to torch DDP.
Rank functions return plain data; verdicts are made here.
"""
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from helpers.comm import CommLedger
from helpers.grading.checks.lab04.common import (
    CAP_MB,
    LR,
    MLP_BUCKETS,
    STEPS,
    TOL,
    flat,
    make_model,
    max_diff,
    rank_batch,
    run_on_ranks,
)
from helpers.grading.registry import answer, public_check
from helpers.grading.shared_run import SharedRun, definitions, part_or_error

WORLD_SIZE = 3
_shared = SharedRun()  # one launch for all the checks of 4.5


class _Scaled(nn.Module):
    """A model called with a keyword argument: the wrapper must pass **kwargs on."""

    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(3, 2)

    def forward(self, x, *, scale=1.0):
        return scale * self.linear(x)


def _shape(BucketedDDP, rank, offset=0):
    """What wrapping does: the attributes torch DDP has, rank 0's start, the module's output, no collective."""
    model = make_model(100 + rank + 10 * offset)
    ddp = BucketedDDP(model, CAP_MB)
    x, _ = rank_batch(0, rank, offset)
    with CommLedger() as ledger, torch.no_grad():
        same_output = torch.equal(ddp(x), model(x))
    torch.manual_seed(rank)
    scaled = _Scaled()
    wrapped = BucketedDDP(scaled, CAP_MB)
    with torch.no_grad():
        same_kwargs = torch.equal(wrapped(x[:, :3], scale=2.0), scaled(x[:, :3], scale=2.0))
    return {"is_module": isinstance(ddp, nn.Module), "module_is_model": getattr(ddp, "module", None) is model,
            "params_are_model": [id(p) for p in ddp.parameters()] == [id(p) for p in model.parameters()],
            "keys": list(ddp.state_dict()) if isinstance(ddp, nn.Module) else [],
            "start": flat([p.detach() for p in model.parameters()]), "same_output": same_output,
            "same_kwargs": same_kwargs, "forward_ops": sorted({r.op for r in ledger.records})}


def _refusal(BucketedDDP, rank, offset=0):
    """forward, backward, forward again without finish_gradient_synchronization(): what the second forward did."""
    ddp = BucketedDDP(make_model(100 + rank + 10 * offset), CAP_MB)
    x, y = rank_batch(0, rank, offset)
    F.mse_loss(ddp(x), y).backward()
    out = {"refused": None, "message": "", "after_finish": None}
    try:
        ddp(x)
    except Exception as exc:  # noqa: BLE001 - RuntimeError is right; another is a wrong answer, reported by name
        out["refused"], out["message"] = type(exc).__name__, str(exc)
    ddp.finish_gradient_synchronization()
    try:
        ddp(x)
        out["after_finish"] = "ran"
    except Exception as exc:  # noqa: BLE001 - reported by name
        out["after_finish"] = f"{type(exc).__name__}: {exc}"
    return out


def one_process(steps, lr, world_size, offset=0):
    """SGD on one process over every rank's batch at once: the mean of equal batches' losses is DDP's objective."""
    model = make_model(100 + 10 * offset)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    for step in range(steps):
        x, y = (torch.cat(parts) for parts in zip(*(rank_batch(step, r, offset) for r in range(world_size))))
        optimizer.zero_grad(set_to_none=True)
        F.mse_loss(model(x), y).backward()
        optimizer.step()
    return flat([p.detach() for p in model.parameters()])


def _train(BucketedDDP, rank, steps, lr, offset=0):
    """The user's loop around the wrapper and around torch DDP, on this rank's batches; the final parameters."""
    from torch.nn.parallel import DistributedDataParallel

    batches = [rank_batch(step, rank, offset) for step in range(steps)]
    results = {}
    for name, wrap in (("ours", lambda m: BucketedDDP(m, CAP_MB)),
                       ("torch", lambda m: DistributedDataParallel(m, bucket_cap_mb=CAP_MB))):
        model = make_model(100 + rank + 10 * offset)  # different initial weights: the constructor must broadcast
        ddp = wrap(model)
        optimizer = torch.optim.SGD(ddp.parameters(), lr=lr)
        with CommLedger() as ledger:
            for x, y in batches:
                optimizer.zero_grad(set_to_none=True)
                F.mse_loss(ddp(x), y).backward()
                if name == "ours":
                    ddp.finish_gradient_synchronization()
                optimizer.step()
        results[name] = {"params": flat([p.detach() for p in model.parameters()]),
                         "all_reduces": sum(r.op == "all_reduce" for r in ledger.records)}
    if rank == 0:  # here, not in the kernel: torch.optim's first use imports torch._dynamo (5-10 s), preloaded here
        results["one_process"] = one_process(steps, lr, dist.get_world_size(), offset)
    return results



def _on_ranks(BucketedDDP, steps, lr, offset=0):
    rank = dist.get_rank()
    return {"shape": part_or_error(_shape, BucketedDDP, rank, offset),
            "refusal": part_or_error(_refusal, BucketedDDP, rank, offset),
            "train": part_or_error(_train, BucketedDDP, rank, steps, lr, offset)}


def _results(ns):
    """The ranks' reports, launched once per answer (the key: every definition the wrapper may use)."""
    cls = answer(ns, "BucketedDDP")
    steps, lr = int(ns.get("STEPS", STEPS)), float(ns.get("LR", LR))
    return _shared("4.5", definitions(ns, steps, lr),
                   lambda: run_on_ranks(_on_ranks, WORLD_SIZE, (cls, steps, lr), "BucketedDDP"))


# ------------------------------------------------------------------------------------------------ question 4.5
@public_check("4.5")
def wraps_the_model_as_torch_ddp_does(ns):
    check_wraps(_results(ns))


def check_wraps(reports, offset=0):
    expected_keys = ["module." + key for key in make_model(0).state_dict()]
    start = flat([p.detach() for p in make_model(100 + 10 * offset).parameters()])
    for rank, report in enumerate(reports):
        shape, at = report["shape"], f"{WORLD_SIZE} ranks, rank {rank}"
        assert "error" not in shape, f"{at}: building BucketedDDP(model) and calling it raised {shape.get('error')}"
        assert shape["is_module"], f"{at}: BucketedDDP(model) is not an nn.Module: subclass nn.Module, as DDP does"
        assert shape["module_is_model"] and shape["keys"] == expected_keys, (
            f"{at}: the wrapper's state_dict keys are {shape['keys'][:3]}..., torch DDP's are {expected_keys[:3]}...: "
            "keep the wrapped model as self.module (the same object), so that checkpoints and ddp.module work as "
            "with torch DDP")
        assert shape["params_are_model"], f"{at}: ddp.parameters() are not the model's own parameter tensors"
        assert not shape["forward_ops"], (
            f"{at}: forward issued {shape['forward_ops']}: a forward only runs the module; build the Reducer (its "
            "broadcast and its hooks) ONCE, in __init__")
        diff = max_diff(shape["start"], start)
        assert diff == 0, (f"{at}: after BucketedDDP(model) the parameters differ from rank 0's by {diff:.2e}: the "
                           "constructor must build the Reducer, which broadcasts rank 0's parameters")
        assert shape["same_output"], f"{at}: ddp(x) differs from model(x): return the module's output unchanged"
        assert shape["same_kwargs"], (f"{at}: ddp(x, scale=2.0) differs from module(x, scale=2.0): forward(*args, "
                                      "**kwargs) must pass the keyword arguments on")


@public_check("4.5")
def refuses_a_step_begun_before_the_last_was_synchronized(ns):
    check_refuses(_results(ns))


def check_refuses(reports, offset=0):
    for rank, report in enumerate(reports):
        refusal, at = report["refusal"], f"{WORLD_SIZE} ranks, rank {rank}"
        assert "error" not in refusal, (
            f"{at}: forward, backward, forward (refused?), finish_gradient_synchronization() raised "
            f"{refusal.get('error')}")
        assert refusal["refused"] == "RuntimeError", (
            f"{at}: forward, backward, then forward again without finish_gradient_synchronization(): the second "
            + ("forward ran. " if refusal["refused"] is None else
               f"forward raised {refusal['refused']}: {refusal['message'][:200]}. ")
            + "Raise RuntimeError there, telling the user to call finish_gradient_synchronization() after "
            "backward(); torch DDP's forward refuses too ('Expected to have finished reduction in the prior "
            "iteration')")
        assert "finish_gradient_synchronization" in refusal["message"], (
            f"{at}: the RuntimeError says {refusal['message'][:200]!r}; say what to do: call "
            "finish_gradient_synchronization() after backward(), before the next forward")
        assert refusal["after_finish"] == "ran", (
            f"{at}: after finish_gradient_synchronization() the next forward failed ({refusal['after_finish']}): "
            "finish_gradient_synchronization() must finish every bucket (the Reducer's finalize()), which leaves "
            "them ready for the next step")


@public_check("4.5")
def trains_like_torch_ddp_and_one_process(ns):
    steps, lr, tol = int(ns.get("STEPS", STEPS)), float(ns.get("LR", LR)), float(ns.get("TOL", TOL))
    check_trains(_results(ns), steps, lr, tol)


def check_trains(reports, steps, lr, tol, offset=0):
    n_buckets = len(MLP_BUCKETS)
    where = f"{WORLD_SIZE} ranks with different data, {steps} SGD steps (lr {lr}) through BucketedDDP"
    error = reports[0]["train"].get("error")
    assert not error, f"{where}: the loop raised {error}" + (
        "; finish_gradient_synchronization() must leave every bucket finished (the Reducer's finalize())"
        if "finish_gradient_synchronization" in error else "")
    ours = reports[0]["train"]["ours"]["params"]
    for rank, report in enumerate(reports):
        train = report["train"]["ours"]
        assert torch.equal(train["params"], ours), (
            f"{where}: rank {rank}'s parameters differ from rank 0's by {max_diff(train['params'], ours):.2e}: "
            "finish_gradient_synchronization() must leave the mean gradient in every p.grad (the Reducer's "
            "finalize())")
        assert train["all_reduces"] == steps * n_buckets, (
            f"{where}: rank {rank} issued {train['all_reduces']} all-reduces, expected {steps * n_buckets} "
            f"({n_buckets} buckets x {steps} steps): one Reducer, built in __init__")
    error = max_diff(ours, reports[0]["train"]["torch"]["params"])
    assert error <= tol, (f"{where}: identical on every rank, but max |parameters - torch DDP's| = {error:.2e} "
                          f"(tolerance {tol:.0e})")
    error = max_diff(ours, reports[0]["train"]["one_process"])
    assert error <= tol, (f"{where}: max |parameters - one process on all {WORLD_SIZE} batches| = {error:.2e} "
                          f"(tolerance {tol:.0e})")
