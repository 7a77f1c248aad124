"""Hidden tests of lab 10 (capstone GPT loop). Public in this repository: see the README.

10.1 and 10.3 leave the sampling to the student (any generator seeded from seed and step), so their probes return
properties (booleans, shapes), which the solution satisfies; 10.2's probes feed fixed batches and return numbers.
"""
from helpers.grading.probes import Probe

SETUP = '''
import torch as _probe_torch
import torch.distributed as _probe_dist
from helpers import launch as _probe_launch
from helpers.grading.checks.lab10 import q3_train_gpt as _probe_lab10


def _probe_batch_facts(n, world_size, batch_size, block_size, step, seed, dtype):
    data = _probe_torch.arange(n).to(dtype)
    pairs = [get_batch(data, r, world_size, step, batch_size, block_size, seed) for r in range(world_size)]
    x, y = _probe_torch.cat([p[0] for p in pairs]), _probe_torch.cat([p[1] for p in pairs])
    one = get_batch(data, 0, 1, step, world_size * batch_size, block_size, seed)
    again = get_batch(data, world_size - 1, world_size, step, batch_size, block_size, seed)
    starts = x[:, 0]
    return {"shapes": [list(t.shape) for p in pairs for t in p], "dtypes": sorted({str(t.dtype) for p in pairs for t in p}),
            "windows": bool((x == starts[:, None] + _probe_torch.arange(block_size)).all() and (y == x + 1).all()),
            "in_range": bool(starts.min() >= 0 and starts.max() + block_size < n),
            "distinct": len(set(starts.tolist())) == len(starts),
            "global_batch": bool(_probe_torch.equal(x, one[0]) and _probe_torch.equal(y, one[1])),
            "deterministic": bool(_probe_torch.equal(again[0], pairs[-1][0]))}


def _probe_all_windows(n, world_size, batch_size, block_size):
    data = _probe_torch.arange(n)
    x = _probe_torch.cat([get_batch(data, r, world_size, 3, batch_size, block_size, 1)[0] for r in range(world_size)])
    return sorted(x[:, 0].tolist())


def _probe_step(clip, steps, width):
    rank = _probe_dist.get_rank()
    _probe_torch.manual_seed(5)
    model = GPT(GPTConfig(vocab_size=11, block_size=6, n_layer=1, n_head=3, n_embd=width))
    optimizer = _probe_torch.optim.AdamW(model.parameters(), lr=2e-2, betas=(0.9, 0.95), weight_decay=0.1)
    losses = []
    for step in range(steps):
        tokens = _probe_torch.randint(11, (3, 7), generator=_probe_torch.Generator().manual_seed(50 + 7 * step + rank))
        losses.append(train_step(model, tokens[:, :-1], tokens[:, 1:], optimizer, clip))
    return {"losses": losses, "grads": _probe_torch.cat([p.grad.reshape(-1) for p in model.parameters()]),
            "params": _probe_torch.cat([p.detach().reshape(-1) for p in model.parameters()])}


def _probe_run(world_size, seed):
    tokenizer, data = _probe_lab10._corpus()
    kwargs = dict(steps=20, batch_size=3, block_size=16, lr=1e-2, grad_clip=0.5, seed=seed,
                  model_config=GPTConfig(tokenizer.vocab_size, 16, n_layer=1, n_head=2, n_embd=24))
    mine = _probe_launch(_probe_lab10._train_on_rank, world_size, args=(train_gpt, data, kwargs), hang_timeout=20)
    batches = [[get_batch(data, r, world_size, s, 3, 16, seed) for s in range(20)] for r in range(world_size)]
    ref_losses, ref_params = _probe_launch(_probe_lab10._ddp_on_rank, world_size, args=(batches, kwargs), hang_timeout=20)[0]
    losses, params = mine[0]["losses"], mine[0]["params"]
    return {"steps": len(losses),
            "identical": all(_probe_torch.equal(m["params"], params) for m in mine),
            "different_data": all(not _probe_torch.equal(batches[0][s][0], batches[r][s][0])
                                  for s in range(20) for r in range(1, world_size)),
            "loss_fell": sum(losses[-3:]) / 3 < losses[0] - 0.5,
            "matches_ddp": max(abs(a - b) for a, b in zip(losses, ref_losses)) < 1e-4
                           and (params - ref_params).abs().max().item() < 5e-3}
'''

PROBES = [
    Probe("10.1", "5 ranks, 97 tokens, step 7: shapes, windows, global batch, distinct",
          "_probe_batch_facts(97, 5, 2, 6, 7, 11, _probe_torch.int64)", points=2),
    Probe("10.1", "uint8 data, 3 ranks", "_probe_batch_facts(40, 3, 3, 4, 2, 0, _probe_torch.uint8)"),
    Probe("10.1", "every window exactly once when there are just enough", "_probe_all_windows(15, 5, 2, 5)"),
    Probe("10.2", "3 ranks, clipping on, 2 steps: losses and parameters",
          "{k: v for k, v in _probe_launch(_probe_step, 3, args=(0.02, 2, 12), hang_timeout=10)[0].items() if k != 'grads'}",
          points=2, rtol=1e-4, atol=1e-4),
    Probe("10.2", "2 ranks, clipping off: the averaged gradient",
          "_probe_launch(_probe_step, 2, args=(1e9, 1, 12), hang_timeout=10)[1]['grads']", atol=1e-6),
    Probe("10.2", "3 ranks: the loss every rank returns",
          "[r['losses'] for r in _probe_launch(_probe_step, 3, args=(1e9, 2, 9), hang_timeout=10)]"),
    Probe("10.3", "3 ranks: different data, identical parameters, falling loss, equal to DDP",
          "_probe_run(3, 7)", points=3),
    Probe("10.3", "2 ranks, another seed", "_probe_run(2, 13)", points=2),
]
