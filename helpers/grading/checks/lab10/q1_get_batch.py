"""Checks of lab 10.1: get_batch, windows with next-character targets; the ranks together draw the global batch."""
import torch

from helpers.grading.registry import answer, public_check

# --- 10.1 get_batch ---------------------------------------------------------------------------------

def _call(get_batch, data, rank, world_size, step, batch_size, block_size, seed):
    """(description, x, y) after checking the shapes and dtypes of one call."""
    call = (f"get_batch(data of {len(data)} {str(data.dtype).removeprefix('torch.')}, rank={rank}, "
            f"world_size={world_size}, step={step}, batch_size={batch_size}, block_size={block_size}, seed={seed})")
    out = get_batch(data, rank, world_size, step, batch_size, block_size, seed)
    assert isinstance(out, tuple) and len(out) == 2, f"{call} returned {type(out).__name__}; return a pair (x, y)"
    for name, t in zip("xy", out):
        assert isinstance(t, torch.Tensor), f"{call}: {name} is a {type(t).__name__}, not a tensor"
        assert tuple(t.shape) == (batch_size, block_size), (
            f"{call}: {name} has shape {tuple(t.shape)}; expected (batch_size, block_size) = {(batch_size, block_size)}")
        assert t.dtype == torch.int64, f"{call}: {name} is {t.dtype}; return int64 (token ids for nn.Embedding)"
    return call, out[0], out[1]


def _global(get_batch, data, world_size, step, batch_size, block_size, seed):
    """The ranks' x rows concatenated in rank order."""
    return torch.cat([_call(get_batch, data, r, world_size, step, batch_size, block_size, seed)[1]
                      for r in range(world_size)])


@public_check("10.1")
def windows_with_next_character_targets(ns):
    """data[i] = i, so every row of x must be o, o+1, ..., and y = x + 1; also from uint8 data."""
    get_batch = answer(ns, "get_batch")
    for dtype in (torch.int64, torch.uint8):
        data = torch.arange(200).to(dtype)
        for rank in range(3):
            call, x, y = _call(get_batch, data, rank, 3, 5, 4, 9, 1)
            starts = x[:, 0]
            assert torch.equal(x, starts[:, None] + torch.arange(9)), (
                f"{call}: the rows of x are not windows data[o:o + block_size] of consecutive tokens; got {x[0].tolist()}")
            assert torch.equal(y, x + 1), (f"{call}: y must be x shifted by one token, y = data[o + 1:o + block_size "
                                           f"+ 1]; row 0: x {x[0].tolist()}, y {y[0].tolist()}")
            assert starts.min() >= 0 and starts.max() + 9 < len(data), (
                f"{call}: a window starts at {starts.max().item()}; its target needs data up to index o + block_size, "
                f"so o <= len(data) - block_size - 1 = {len(data) - 10}")


@public_check("10.1")
def ranks_together_make_the_global_batch(ns):
    get_batch = answer(ns, "get_batch")
    data = torch.arange(300)
    for world_size, batch_size, step, seed in ((2, 3, 0, 0), (3, 4, 7, 5), (4, 1, 2, 1), (3, 2, 11, 2)):
        ranks = _global(get_batch, data, world_size, step, batch_size, 6, seed)
        _, one, _ = _call(get_batch, data, 0, 1, step, world_size * batch_size, 6, seed)
        assert torch.equal(ranks, one), (
            f"world_size={world_size}, batch_size={batch_size}, step={step}, seed={seed}: the ranks' rows, one after the "
            f"other, start at {ranks[:, 0].tolist()}, but one process with batch_size={world_size * batch_size} draws "
            f"{one[:, 0].tolist()}. Draw the whole global batch from a generator seeded with seed and step only (not "
            "the rank), then keep rows rank * batch_size ... (rank + 1) * batch_size - 1")


@public_check("10.1")
def different_for_every_rank_step_and_seed(ns):
    get_batch = answer(ns, "get_batch")
    data = torch.arange(300)
    xs = [_call(get_batch, data, r, 3, 0, 4, 6, 0)[1] for r in range(3)]
    for a in range(3):
        for b in range(a + 1, 3):
            assert not torch.equal(xs[a], xs[b]), f"ranks {a} and {b} got the same batch at step 0: use the rank"
    for other, what in ((_call(get_batch, data, 0, 3, 1, 4, 6, 0)[1], "step 1"),
                        (_call(get_batch, data, 0, 3, 0, 4, 6, 1)[1], "seed 1")):
        assert not torch.equal(xs[0], other), (f"rank 0 got the same batch at step 0, seed 0 and at {what}: seed the "
                                               "generator with seed AND step, so every step draws a new batch")


@public_check("10.1")
def no_window_twice_in_a_step(ns):
    """Without replacement: 52 possible windows, 12 per step; and exactly all 12 when only 12 exist."""
    get_batch = answer(ns, "get_batch")
    for step in range(20):
        starts = _global(get_batch, torch.arange(60), 3, step, 4, 8, 0)[:, 0].tolist()
        assert len(set(starts)) == len(starts), (
            f"step {step}: the global batch reads windows starting at {sorted(starts)}, some twice; draw the offsets "
            "without replacement (torch.randperm), so no window is read twice in a step")
    starts = sorted(_global(get_batch, torch.arange(20), 3, 0, 4, 8, 0)[:, 0].tolist())
    assert starts == list(range(12)), (
        f"20 tokens, block_size=8: exactly 12 windows exist (offsets 0 ... 11), and the global batch has 12; it "
        f"should read each once, but starts at {starts}")


@public_check("10.1")
def deterministic_and_leaves_the_global_generator_alone(ns):
    get_batch = answer(ns, "get_batch")
    data = torch.arange(300)
    state = torch.get_rng_state()
    first = _call(get_batch, data, 1, 3, 4, 4, 6, 2)[1]
    torch.manual_seed(12345)  # whatever the global generator's state, the same batch
    again = _call(get_batch, data, 1, 3, 4, 4, 6, 2)[1]
    assert torch.equal(first, again), "get_batch with the same arguments returned another batch: seed a generator"
    torch.set_rng_state(state)
    _call(get_batch, data, 1, 3, 4, 4, 6, 2)
    assert torch.equal(torch.get_rng_state(), state), (
        "get_batch changed torch's global random state; draw from your own torch.Generator() seeded with seed and "
        "step, so that reading data does not change what the rest of the program draws (e.g. a model's initialisation)")
