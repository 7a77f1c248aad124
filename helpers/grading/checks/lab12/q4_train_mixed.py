"""Checks of lab 12.4: train_mixed, the whole mixed-precision DDP loop (fp16 autocast, a loss scaler, clipping).

Three ranks train the same DDP model on different data; one batch of rank 1 holds an outlier, and the scale starts
high, so some steps overflow in fp16 and are skipped. The student's loop runs with torch.amp.GradScaler("cpu"), then
with the student's own LossScaler (12.1); the reference loop (GradScaler's documented order: scale, backward,
unscale_, clip, step, update) and its usual wrong orders run beside them on the same ranks and data.
"""
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from helpers.backend import rank_device
from helpers.grading.checks.lab12 import common
from helpers.grading.checks.lab12.common import TOL, flat, max_diff, record_scales
from helpers.grading.registry import answer, public_check
from helpers.grading.shared_run import definitions, part_or_error

STEPS, LR, MAX_NORM, INIT_SCALE, INTERVAL = 10, 0.5, 0.5, 2.0**16, 3


def _model_and_batches():
    """The same DDP model on every rank, and this rank's own batches (rank 1's third holds an outlier)."""
    rank = dist.get_rank()
    torch.manual_seed(42 + common.OFFSET)
    model = DDP(nn.Sequential(nn.Linear(6, 16), nn.GELU(), nn.Linear(16, 3)).to(rank_device()))
    teacher = torch.randn(6, 3, generator=torch.Generator().manual_seed(43 + common.OFFSET))
    g = torch.Generator().manual_seed(420 + rank + 10 * common.OFFSET)
    batches = []
    for t in range(STEPS):
        x = torch.randn(8, 6, generator=g)
        if rank == 1 and t == 2 + common.OFFSET % 3:
            x[0] *= 1000.0
        batches.append((x.to(rank_device()), (x @ teacher).argmax(1).to(rank_device())))
    return model, batches


def _reference(variant=""):
    """The reference loop, or one of the usual wrong ones."""
    def loop(model, batches, scaler, *, lr, max_norm):
        optimizer = torch.optim.SGD(model.parameters(), lr=lr)
        for x, y in batches:
            with torch.autocast(x.device.type, dtype=torch.float16, enabled=variant != "no autocast"):
                loss = F.cross_entropy(model(x), y)
            if variant != "no zero_grad":
                optimizer.zero_grad()
            scaled = scaler.scale(loss)
            (scaler.scale(scaled) if variant == "scaled twice" else scaled).backward()
            if variant != "clip before unscale":
                scaler.unscale_(optimizer)
            if variant != "no clip":
                nn.utils.clip_grad_norm_(model.parameters(), max_norm)
            scaler.step(optimizer)
            scaler.update()
        return optimizer
    return loop


VARIANTS = {
    "clip before unscale": "the gradients were clipped while still scaled (S times too large): call "
                           "scaler.unscale_(optimizer) BEFORE clip_grad_norm_, so that max_norm applies to the true "
                           "gradients (step() then does not unscale again)",
    "no clip": "the gradients were not clipped: torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm) after "
               "unscale_",
    "scaled twice": "the loss was scaled twice (S squared): call scaler.scale(loss) once, and backward() on its result",
    "no zero_grad": "the gradients add up from step to step: zero them (optimizer.zero_grad()) before each backward",
    "no autocast": "the forward did not run under torch.autocast(x.device.type, dtype=torch.float16): no step "
                   "overflowed",
}


def _run(loop, scaler):
    model, batches = _model_and_batches()
    used = record_scales(scaler)
    loop(model, batches, scaler, lr=LR, max_norm=MAX_NORM)
    return {"used": used, "params": flat(model.parameters())}


def _gradscaler():
    return torch.amp.GradScaler(rank_device().type, init_scale=INIT_SCALE, growth_interval=INTERVAL)


def _on_rank(train_fn, scaler_cls):
    """Runs on every rank: the student's loop with GradScaler, with the LossScaler given, and the reference loops."""
    mine = part_or_error(_run, train_fn, _gradscaler())
    if "error" in mine:
        return {"mine": mine}
    try:
        yours = _run(train_fn, scaler_cls(INIT_SCALE, growth_interval=INTERVAL))
    except NotImplementedError:
        yours = {"error": "not implemented"}
    except Exception as exc:  # noqa: BLE001 - the LossScaler of 12.1 may raise anything
        yours = {"error": f"{type(exc).__name__}: {exc}"}
    references = {variant: _run(_reference(variant), _gradscaler()) for variant in ("", *VARIANTS)}
    return {"mine": mine, "with LossScaler": yours, "references": references}


HINT = ("every rank must run the same number of steps, each with one forward and one backward of its DDP model "
        "(DDP all-reduces the gradients in backward). ")


def _results(ns):
    fn, cls = answer(ns, "train_mixed"), answer(ns, "LossScaler")
    return common._memoized("12.4", definitions(ns), lambda: common._launch(_on_rank, fn, cls, hint=HINT))


def _checked_results(ns):
    """The ranks' results; a loop that raised with GradScaler fails every check with its error, said once."""
    results = _results(ns)
    for rank, result in enumerate(results):
        error = result["mine"].get("error") if isinstance(result["mine"], dict) else None
        if error:
            order = (": call scaler.update() once per step, after scaler.step(optimizer); it also readies the scaler "
                     "for the next step" if "after step()" in error or "since the last update()" in error else
                     ": run it yourself to see where")
            raise common.shared_failure(f"rank {rank}: your loop with torch.amp.GradScaler raised {error}{order}")
    return results


@public_check("12.4")
def identical_parameters_on_every_rank(ns):
    results = _checked_results(ns)
    for rank, result in enumerate(results):
        diff = max_diff(result["mine"]["params"], results[0]["mine"]["params"])
        assert diff == 0, (f"rank {rank}'s parameters differ from rank 0's by {diff:.3g} after training on different "
                           "data: step the DDP model itself, and skip or step on every rank together (the scaler "
                           "tests the all-reduced gradients)")


@public_check("12.4")
def equal_to_gradscalers_documented_loop(ns):
    results = _checked_results(ns)
    mine, references = results[0]["mine"], results[0]["references"]
    diff = max_diff(mine["params"], references[""]["params"])
    if diff <= TOL:
        return
    for variant, why in VARIANTS.items():
        if max_diff(mine["params"], references[variant]["params"]) <= TOL:
            raise AssertionError(why)
    if not mine["used"]:
        raise AssertionError("scaler.update() was never called: call it once per step, after scaler.step(optimizer)")
    raise AssertionError(f"the parameters differ from the reference loop's by {diff:.3g}: per batch, forward under "
                         "fp16 autocast, zero_grad, scaler.scale(loss).backward(), scaler.unscale_(optimizer), "
                         "clip_grad_norm_, scaler.step(optimizer), scaler.update()")


@public_check("12.4")
def skips_and_scales_like_the_reference(ns):
    results = _checked_results(ns)
    mine, want = list(results[0]["mine"]["used"]), list(results[0]["references"][""]["used"])
    assert mine, "scaler.update() was never called: call it once per step, after scaler.step(optimizer)"
    assert mine == want, (f"the scales used were {mine}, the reference's {want}: one scaler.update() per step, after "
                          "scaler.step(optimizer)")


@public_check("12.4")
def same_run_with_your_loss_scaler(ns):
    """The lab's point: your own LossScaler (12.1) in the loop, on every rank, gives GradScaler's run."""
    results = _checked_results(ns)
    for rank, result in enumerate(results):
        yours, mine = result["with LossScaler"], result["mine"]
        assert "error" not in yours, (f"with your LossScaler (12.1) the loop raised {yours.get('error')}: make 12.1's "
                                      "checks pass first")
        diff = max_diff(yours["params"], mine["params"])
        assert diff <= TOL and list(yours["used"]) == list(mine["used"]), (
            f"rank {rank}: with your LossScaler the parameters differ from GradScaler's run by {diff:.3g} (scales "
            f"{list(yours['used'])}, GradScaler's {list(mine['used'])}): see 12.1's checks")
