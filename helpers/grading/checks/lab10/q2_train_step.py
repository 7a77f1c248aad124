"""Checks of lab 10.2: train_step averages then clips the gradients, equal to one process on the global batch."""
import torch
import torch.distributed as dist

from helpers.grading.checks.lab10.common import (
    WORLD_SIZE,
    _flat,
    _launch,
    _memoized,
    _optimizer,
    _still_a_todo,
    capstone_model,
)
from helpers.grading.registry import answer, public_check

# --- 10.2 train_step --------------------------------------------------------------------------------

CONFIG_10_2 = dict(vocab_size=13, block_size=8, n_layer=1, n_head=2, n_embd=16)
STEPS_10_2, BATCH_10_2, LR_10_2 = 3, 2, 1e-2
CLIPS_10_2 = {"off": 1e9, "on": 0.05}  # 0.05 is far below the gradient's norm here: clipping is active
# 3 ranks vs one process: gradients are sums in another order (a few roundings of float32); after 3 AdamW steps
# parameters differ more (measured 1.4e-5 with lr 1e-2: m / sqrt(v) turns rounding noise into steps of about lr).
TOL_GRADS_10_2, TOL_PARAMS_10_2 = 1e-5, 1e-4


def _gpt_10_2():
    model = capstone_model()
    torch.manual_seed(0)
    return model.GPT(model.GPTConfig(**CONFIG_10_2))


def _batch_10_2(rank, step):
    tokens = torch.randint(CONFIG_10_2["vocab_size"], (BATCH_10_2, CONFIG_10_2["block_size"] + 1),
                           generator=torch.Generator().manual_seed(1000 + 10 * step + rank))
    return tokens[:, :-1], tokens[:, 1:]


def _step_on_rank(train_step):
    """Runs on every rank: the same GPT, this rank's batches, the student's train_step; clipping off, then on.

    Rank 0 also computes the one-process reference (the ranks have torch._dynamo preloaded; the kernel would pay
    seconds to import it at its first optimizer step)."""
    out = {}
    for name, clip in CLIPS_10_2.items():
        model = _gpt_10_2()
        optimizer = _optimizer(model, LR_10_2)
        log = out[name] = {"losses": [], "types": [], "grads": [], "params": []}
        for step in range(STEPS_10_2):
            loss = train_step(model, *_batch_10_2(dist.get_rank(), step), optimizer, clip)
            log["types"].append(type(loss).__name__)
            log["losses"].append(float(loss) if isinstance(loss, (float, int, torch.Tensor)) else float("nan"))
            log["grads"].append(_flat(p.grad if p.grad is not None else torch.zeros_like(p) for p in model.parameters()))
            log["params"].append(_flat(model.parameters()))
    reference = {name: _reference_10_2(clip) for name, clip in CLIPS_10_2.items()} if dist.get_rank() == 0 else None
    return out, reference


def _reference_10_2(clip):
    """One process on the global batch (the ranks' batches together): losses, clipped gradients, parameters."""
    model = _gpt_10_2()
    optimizer = _optimizer(model, LR_10_2)
    log = {"losses": [], "grads": [], "params": [], "local_losses": [], "local_grads": []}
    for step in range(STEPS_10_2):
        batches = [_batch_10_2(rank, step) for rank in range(WORLD_SIZE)]
        local = []
        for x, y in batches:  # what each rank sees alone, for the error messages
            model.zero_grad()
            _, loss = model(x, y)
            loss.backward()
            local.append((loss.item(), _flat(p.grad for p in model.parameters())))
        log["local_losses"].append([l for l, _ in local])
        log["local_grads"].append([g for _, g in local])
        optimizer.zero_grad()
        _, loss = model(torch.cat([x for x, _ in batches]), torch.cat([y for _, y in batches]))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        optimizer.step()
        log["losses"].append(loss.item())
        log["grads"].append(_flat(p.grad for p in model.parameters()))
        log["params"].append(_flat(model.parameters()))
    return log


def _step_results(ns):
    fn = answer(ns, "train_step")
    hint = "Every rank must call the same collectives in the same order in every step. "

    def compute():
        if _still_a_todo(fn, None, None, None, None, None):
            raise NotImplementedError("lab 10.2")
        results = _launch(_step_on_rank, fn, hint=hint)
        return [out for out, _ in results], results[0][1]
    return _memoized("10.2", fn, compute)


def _close(a, b, tol=TOL_GRADS_10_2):
    return torch.allclose(a, b, rtol=tol, atol=tol)


@public_check("10.2")
def gradients_are_the_mean_over_ranks(ns):
    """Clipping off: after train_step, .grad is the gradient of the global batch, on every rank."""
    results, reference = _step_results(ns)
    expected = reference["off"]["grads"][0]
    for rank, out in enumerate(results):
        got = out["off"]["grads"][0]
        if _close(got, WORLD_SIZE * expected):
            raise AssertionError(f"rank {rank}: after train_step the gradients are the SUM over the {WORLD_SIZE} ranks; "
                                 "divide by the world size to get the mean")
        if _close(got, reference["off"]["local_grads"][0][rank]):
            raise AssertionError(f"rank {rank}: after train_step .grad is still this rank's own gradient; all-reduce "
                                 "the gradients (not the parameters) and divide by the world size")
        assert _close(got, expected), (
            f"rank {rank}: after train_step .grad is not the gradient of the global batch (the mean over ranks); max "
            f"error {(got - expected).abs().max().item():.3g}. Zero the gradients before backward, every step")


@public_check("10.2")
def clipped_after_averaging(ns):
    """Clipping on (grad_clip=0.05): .grad is the global batch's gradient clipped to total norm 0.05."""
    results, reference = _step_results(ns)
    expected = reference["on"]["grads"][0]
    for rank, out in enumerate(results):
        got = out["on"]["grads"][0]
        assert _close(got, expected), (
            f"rank {rank}: with grad_clip=0.05, .grad after train_step should be the global batch's gradient clipped "
            f"to norm 0.05 (norm {got.norm().item():.4f}, max error {(got - expected).abs().max().item():.3g}). Clip "
            "AFTER averaging: clipping each rank's own gradient first gives every rank its own factor")


@public_check("10.2")
def identical_on_every_rank_and_equal_to_one_process(ns):
    results, reference = _step_results(ns)
    for name, clip in CLIPS_10_2.items():
        first = results[0][name]["params"][-1]
        for rank, out in enumerate(results[1:], start=1):
            diff = (out[name]["params"][-1] - first).abs().max().item()
            assert diff == 0, (
                f"grad_clip={clip:g}: after {STEPS_10_2} steps rank {rank}'s parameters differ from rank 0's by {diff:.3g}; "
                "every rank must step with the same (averaged, clipped) gradient")
        expected = reference[name]["params"][-1]
        assert _close(first, expected, TOL_PARAMS_10_2), (
            f"grad_clip={clip:g}: after {STEPS_10_2} steps the parameters differ from one process on the global batch "
            f"by {(first - expected).abs().max().item():.3g} (tolerance {TOL_PARAMS_10_2:g})")


@public_check("10.2")
def returns_the_global_batch_loss(ns):
    results, reference = _step_results(ns)
    expected = reference["off"]["losses"]
    for rank, out in enumerate(results):
        got = out["off"]["losses"]
        assert all(t == "float" for t in out["off"]["types"]), (
            f"rank {rank}: train_step returned {out['off']['types'][0]}; return a Python float (.item() after the "
            "all-reduce)")
        local = reference["off"]["local_losses"][0][rank]   # step 0: every replica still equals the reference
        if abs(got[0] - local) < 1e-5 and abs(local - expected[0]) > 1e-4:
            raise AssertionError(f"rank {rank} returned its own batch's loss {[round(v, 4) for v in got]}; return the "
                                 "global batch's: all-reduce the loss and divide by the world size")
        assert all(abs(g - e) < 1e-5 for g, e in zip(got, expected)), (
            f"rank {rank} returned {[round(v, 5) for v in got]}; the global batch's losses are "
            f"{[round(v, 5) for v in expected]}")
