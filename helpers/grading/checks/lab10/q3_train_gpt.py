"""Checks of lab 10.3: train_gpt, different data, identical parameters, a falling loss, equal to torch DDP."""
import hashlib
import math

import torch
import torch.distributed as dist

from helpers.grading.checks.lab10.common import (
    WORLD_SIZE,
    _capstone,
    _flat,
    _launch,
    _memoized,
    _optimizer,
    _still_a_todo,
    capstone_model,
)
from helpers.grading.registry import answer, public_check

# 10.3's pass mark for the mean loss of the last 5 steps. ln V (4.06 for the shipped corpus) is a model that knows
# nothing; the corpus's unigram entropy (3.01: character frequencies, no context) is what 30 steps of the tiny model
# reach (the solution: 3.02).
THRESHOLD = 3.25
# 10.3 vs torch DDP on the same batches: per-step loss and final parameters. Measured with the solution: 1e-6 and
# 6e-4. AdamW's update m / (sqrt(v) + eps) is about lr = 1e-2 in size even when a gradient entry is rounding noise
# (3 ranks add in another order than DDP's bucket), so parameters differ far more than losses. A real bug (wrong
# rows, no broadcast, clipping before averaging) moves every parameter by about lr per step.
TOL_LOSS, TOL_PARAMS = 1e-4, 5e-3


# --- 10.3 train_gpt ---------------------------------------------------------------------------------

STEPS_10_3, BATCH_10_3, BLOCK_10_3, LR_10_3, CLIP_10_3, SEED_10_3 = 30, 4, 32, 1e-2, 1.0, 3


def _config_10_3(vocab_size):
    return capstone_model().GPTConfig(vocab_size, BLOCK_10_3, n_layer=1, n_head=2, n_embd=32)


def _kwargs_10_3(vocab_size):
    return dict(steps=STEPS_10_3, batch_size=BATCH_10_3, block_size=BLOCK_10_3, lr=LR_10_3, grad_clip=CLIP_10_3,
                seed=SEED_10_3, model_config=_config_10_3(vocab_size))


def _corpus():
    return _capstone("data").load_corpus()


def _train_on_rank(train_gpt, data, kwargs):
    return train_gpt(data, **kwargs)


def _ddp_on_rank(batches, kwargs):
    """torch DDP on the given per-rank batches: the reference for 10.3 (DDP's constructor broadcasts rank 0's)."""
    from torch.nn.parallel import DistributedDataParallel as DDP
    rank = dist.get_rank()
    torch.manual_seed(kwargs["seed"] + rank)
    model = DDP(capstone_model().GPT(kwargs["model_config"]))
    optimizer = _optimizer(model, kwargs["lr"])
    losses = []
    for x, y in batches[rank]:
        _, loss = model(x, y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), kwargs["grad_clip"])
        optimizer.step()
        total = loss.detach().clone()
        dist.all_reduce(total)
        losses.append(total.item() / dist.get_world_size())
    return losses, _flat(model.module.parameters())


def _batches_10_3(get_batch, data):
    """[rank][step] -> (x, y) from the student's get_batch, computed in the kernel."""
    return [[get_batch(data, rank, WORLD_SIZE, step, BATCH_10_3, BLOCK_10_3, SEED_10_3) for step in range(STEPS_10_3)]
            for rank in range(WORLD_SIZE)]


def _digest(batches):
    h = hashlib.sha256()
    for per_rank in batches:
        for x, y in per_rank:
            h.update(x.numpy().tobytes())
            h.update(y.numpy().tobytes())
    return h.hexdigest()


def _training_results(ns):
    train_gpt, get_batch = answer(ns, "train_gpt"), answer(ns, "get_batch")
    tokenizer, data = _corpus()
    kwargs = _kwargs_10_3(tokenizer.vocab_size)
    hint = "Every rank must run the same number of steps, with the same collectives in each. "

    def compute():
        if _still_a_todo(train_gpt, None, **{**kwargs, "steps": 0, "model_config": None}):
            raise NotImplementedError("lab 10.3")
        return _launch(_train_on_rank, train_gpt, data, kwargs, hint=hint)
    mine = _memoized("10.3", (train_gpt, get_batch, ns.get("train_step")), compute)
    batches = _batches_10_3(get_batch, data)
    reference = _memoized("10.3/ddp", _digest(batches), lambda: _launch(_ddp_on_rank, batches, kwargs)[0])
    return mine, reference, batches


def _unpack(rank, out):
    assert isinstance(out, dict) and {"losses", "params"} <= set(out), (
        f"rank {rank} returned {type(out).__name__} {str(out)[:80]}; return {{'losses': [...], 'params': tensor}}")
    return out["losses"], out["params"]


@public_check("10.3")
def returns_losses_and_parameters(ns):
    mine, (_, ref_params), _ = _training_results(ns)
    for rank, out in enumerate(mine):
        losses, params = _unpack(rank, out)
        assert isinstance(losses, list) and len(losses) == STEPS_10_3 and all(isinstance(v, float) for v in losses), (
            f"rank {rank}: 'losses' should be a list of {STEPS_10_3} floats (one per step), got {str(losses)[:80]}")
        assert isinstance(params, torch.Tensor) and params.shape == ref_params.shape, (
            f"rank {rank}: 'params' should be one flat tensor of the {ref_params.numel()} parameters, got "
            f"{getattr(params, 'shape', type(params).__name__)}")


@public_check("10.3")
def different_data_identical_parameters(ns):
    """The invariant: every rank read its own batches, and every rank ends with the same parameters, bit for bit."""
    mine, _, batches = _training_results(ns)
    for step in range(STEPS_10_3):
        xs = [batches[rank][step][0] for rank in range(WORLD_SIZE)]
        assert all(not torch.equal(xs[0], x) for x in xs[1:]), f"get_batch gives two ranks the same batch at step {step}"
    first = _unpack(0, mine[0])[1]
    for rank in range(1, WORLD_SIZE):
        diff = (_unpack(rank, mine[rank])[1] - first).abs().max().item()
        assert diff == 0, (f"after {STEPS_10_3} steps rank {rank}'s parameters differ from rank 0's by up to {diff:.3g}; "
                           "start from rank 0's parameters (broadcast them, the ranks are seeded differently) and step "
                           "with the averaged gradient (train_step)")


@public_check("10.3")
def final_loss_below_threshold(ns):
    losses = _unpack(0, _training_results(ns)[0][0])[0]
    final = sum(losses[-5:]) / 5
    tokenizer, data = _corpus()
    frequency = torch.bincount(data).double() / len(data)
    unigram = -(frequency * frequency.log()).sum().item()
    assert final < THRESHOLD and final < losses[0], (
        f"the mean loss of the last 5 of {STEPS_10_3} steps is {final:.3f} (first step {losses[0]:.3f}); it should be "
        f"below {THRESHOLD} (ln V = {math.log(tokenizer.vocab_size):.2f} knows nothing; the characters' frequencies "
        f"alone give {unigram:.2f})")


@public_check("10.3")
def equals_torch_ddp(ns):
    mine, (ref_losses, ref_params), _ = _training_results(ns)
    losses, params = _unpack(0, mine[0])
    loss_gap = max(abs(a - b) for a, b in zip(losses, ref_losses))
    assert loss_gap < TOL_LOSS and not math.isnan(loss_gap), (
        f"the losses differ from torch DDP's on the same batches by up to {loss_gap:.3g} (tolerance {TOL_LOSS:g}); each "
        "rank must read get_batch(data, rank, world_size, step, ...) at every step, and step as train_step does "
        "(clipping after averaging)")
    param_gap = (params - ref_params).abs().max().item()
    assert param_gap < TOL_PARAMS, (
        f"after {STEPS_10_3} steps the parameters differ from torch DDP's by {param_gap:.3g} (tolerance {TOL_PARAMS:g})")
