"""Hidden tests of lab 10 (capstone GPT loop). Public in this repository: see the README.

10.1 and 10.3 leave the sampling to the student (any generator seeded from seed and step), so there is no single
right value: their probes return the raw batches, losses and parameters, and the judges below compute the
properties (and run torch DDP on the student's own batches) in the grader's process, never in the student's
kernel. 10.2's probes feed batches drawn from the question's secret seed and return numbers.
"""
import math

from helpers.grading.probes import Probe

SETUP = '''
import torch as _probe_torch
import torch.distributed as _probe_dist
from helpers.grading.shared_run import launch_gloo as _probe_launch
from helpers.grading.checks.lab10 import q3_train_gpt as _probe_lab10


def _probe_kwargs(vocab_size, seed):
    model = _probe_lab10.capstone_model().GPTConfig(vocab_size, 16, n_layer=1, n_head=2, n_embd=24)
    return dict(steps=20, batch_size=3, block_size=16, lr=1e-2, grad_clip=0.5, seed=seed, model_config=model)


def _probe_batches(n, world_size, batch_size, block_size, step, seed, dtype):
    """Raw batches: every rank's, the same global batch on one rank, the last rank's again."""
    data = _probe_torch.arange(n).to(dtype)
    pairs = [list(get_batch(data, r, world_size, step, batch_size, block_size, seed)) for r in range(world_size)]
    one = list(get_batch(data, 0, 1, step, world_size * batch_size, block_size, seed))
    again = list(get_batch(data, world_size - 1, world_size, step, batch_size, block_size, seed))
    later = list(get_batch(data, 0, world_size, step + 1, batch_size, block_size, seed))
    return {"pairs": pairs, "one": one, "again": again, "later": later}


def _probe_all_windows(n, world_size, batch_size, block_size):
    data = _probe_torch.arange(n)
    x = _probe_torch.cat([get_batch(data, r, world_size, _PROBE_SEED % 50, batch_size, block_size, _PROBE_SEED % 1000)[0]
                   for r in range(world_size)])
    return sorted(x[:, 0].tolist())


def _probe_step(clip, steps, width):
    rank = _probe_dist.get_rank()
    _probe_torch.manual_seed(_PROBE_SEED + 5)
    model = GPT(GPTConfig(vocab_size=11, block_size=6, n_layer=1, n_head=3, n_embd=width))
    optimizer = _probe_torch.optim.AdamW(model.parameters(), lr=2e-2, betas=(0.9, 0.95), weight_decay=0.1)
    losses = []
    for step in range(steps):
        tokens = _probe_torch.randint(11, (3, 7), generator=_probe_torch.Generator().manual_seed(_PROBE_SEED + 50 + 7 * step + rank))
        losses.append(train_step(model, tokens[:, :-1], tokens[:, 1:], optimizer, clip))
    return {"losses": losses, "grads": _probe_torch.cat([p.grad.reshape(-1) for p in model.parameters()]),
            "params": _probe_torch.cat([p.detach().reshape(-1) for p in model.parameters()])}


def _probe_run(world_size, seed):
    """Raw: every rank's losses and parameters after train_gpt, and the batches get_batch gives each rank."""
    tokenizer, data = _probe_lab10._corpus()
    kwargs = _probe_kwargs(tokenizer.vocab_size, seed)
    mine = _probe_launch(_probe_lab10._train_on_rank, world_size, args=(train_gpt, data, kwargs), hang_timeout=20)
    batches = [[list(get_batch(data, r, world_size, s, 3, 16, seed)) for s in range(20)] for r in range(world_size)]
    return {"losses": [m["losses"] for m in mine], "params": [m["params"] for m in mine], "batches": batches}
'''



# --- judges: run in the grader's process on the raw values ---------------------------------------------------

def _facts(raw, n, block_size):
    """What 10.1 asks of get_batch, computed from its raw output."""
    import torch

    from helpers.grading.plain import from_plain

    raw = from_plain(raw)
    pairs = raw["pairs"]
    x, y = torch.cat([p[0] for p in pairs]), torch.cat([p[1] for p in pairs])
    starts = x[:, 0]
    return {"shapes": [list(t.shape) for p in pairs for t in p], "dtypes": sorted({str(t.dtype) for p in pairs for t in p}),
            "windows": bool((x == starts[:, None] + torch.arange(block_size)).all() and (y == x + 1).all()),
            "in_range": bool(starts.min() >= 0 and starts.max() + block_size < n),
            "distinct": len(set(starts.tolist())) == len(starts),
            "global_batch": bool(torch.equal(x, raw["one"][0]) and torch.equal(y, raw["one"][1])),
            "deterministic": bool(torch.equal(raw["again"][0], pairs[-1][0])),
            "changes_with_step": not torch.equal(raw["later"][0], pairs[0][0])}


def _judge_batches(n, block_size):
    def judge(expected, actual, question_seed):
        try:
            mine, theirs = _facts(actual, n, block_size), _facts(expected, n, block_size)
        except (KeyError, IndexError, TypeError, ValueError, RuntimeError) as exc:
            return False, f"get_batch returned something else than (x, y) pairs of tensors ({type(exc).__name__})"
        wrong = [k for k in theirs if mine[k] != theirs[k]]
        return (not wrong, "" if not wrong else "wrong: " + ", ".join(wrong))
    return judge


def _judge_run(world_size):
    def judge(expected, actual, question_seed):
        import torch

        from helpers import launch
        from helpers.grading.checks.lab10 import q3_train_gpt as lab10
        from helpers.grading.plain import from_plain

        try:
            run = from_plain(actual)
            losses, params, batches = run["losses"], run["params"], run["batches"]
            assert len(losses) == len(params) == len(batches) == world_size
        except (KeyError, TypeError, AssertionError):
            return False, f"train_gpt did not return {{'losses', 'params'}} on each of {world_size} ranks"
        if any(len(ls) != 20 for ls in losses):
            return False, f"{len(losses[0])} losses on rank 0 for 20 steps"
        if not all(torch.equal(p, params[0]) for p in params):
            return False, "the ranks end with different parameters"
        if any(torch.equal(batches[0][s][0], batches[r][s][0]) for s in range(20) for r in range(1, world_size)):
            return False, "two ranks read the same batch"
        if not sum(losses[0][-3:]) / 3 < losses[0][0] - 0.5:
            return False, "the loss did not fall"
        tokenizer, _ = lab10._corpus()
        kwargs = _probe_kwargs_for_judge(tokenizer.vocab_size, question_seed % 1000)
        ref_losses, ref_params = launch(lab10._ddp_on_rank, world_size, args=(batches, kwargs), backend="gloo",
                                        hang_timeout=30)[0]
        gap = max(abs(a - b) for a, b in zip(losses[0], ref_losses))
        if not gap < 1e-4 or math.isnan(gap) or (params[0] - ref_params).abs().max().item() >= 5e-3:
            return False, "not what torch DDP gives on your own batches"
        return True, ""
    return judge


def _probe_kwargs_for_judge(vocab_size, seed):
    from helpers.grading.checks.lab10 import q3_train_gpt as lab10

    model = lab10.capstone_model().GPTConfig(vocab_size, 16, n_layer=1, n_head=2, n_embd=24)
    return dict(steps=20, batch_size=3, block_size=16, lr=1e-2, grad_clip=0.5, seed=seed, model_config=model)


# The library implementations of what 10.2 and 10.3 ask for.
_LIBRARY = ("DistributedDataParallel", "fully_shard", "FullyShardedDataParallel", "ZeroRedundancyOptimizer")

PROBES = [
    Probe("10.1", "5 ranks, 97 tokens, a secret step and seed: shapes, windows, global batch, distinct",
          "_probe_batches(97, 5, 2, 6, _PROBE_SEED % 50, _PROBE_SEED % 1000, _probe_torch.int64)", points=2,
          judge=_judge_batches(97, 6)),
    Probe("10.1", "uint8 data, 3 ranks", "_probe_batches(40, 3, 3, 4, _PROBE_SEED % 7, _PROBE_SEED % 100, _probe_torch.uint8)",
          judge=_judge_batches(40, 4)),
    Probe("10.1", "every window exactly once when there are just enough", "_probe_all_windows(15, 5, 2, 5)"),
    Probe("10.2", "3 ranks, clipping on, 2 steps: losses and parameters",
          "{k: v for k, v in _probe_launch(_probe_step, 3, args=(0.02, 2, 12), hang_timeout=10)[0].items() if k != 'grads'}",
          points=2, rtol=1e-4, atol=1e-4, forbidden=_LIBRARY),
    Probe("10.2", "2 ranks, clipping off: the averaged gradient",
          "_probe_launch(_probe_step, 2, args=(1e9, 1, 12), hang_timeout=10)[1]['grads']", atol=1e-6, forbidden=_LIBRARY),
    Probe("10.2", "3 ranks: the loss every rank returns",
          "[r['losses'] for r in _probe_launch(_probe_step, 3, args=(1e9, 2, 9), hang_timeout=10)]", forbidden=_LIBRARY),
    Probe("10.3", "3 ranks: different data, identical parameters, falling loss, equal to DDP on your batches",
          "_probe_run(3, _PROBE_SEED % 1000)", points=3, judge=_judge_run(3), forbidden=_LIBRARY),
    Probe("10.3", "2 ranks", "_probe_run(2, _PROBE_SEED % 1000)", points=2, judge=_judge_run(2),
          forbidden=_LIBRARY),
]
