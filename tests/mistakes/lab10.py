"""Lab 10 (capstone GPT): batches seeded with the rank or drawn with replacement, targets not shifted, the global
RNG used; a step that sums, clips before averaging or returns its own loss; replicas never synchronised."""
import sys

from helpers.grading.labgen import ROOT
from tests.mistakes import Mistake

SOLUTION = ROOT / "solutions" / "10_capstone_gpt.ipynb"
# The lab's imports cell puts chapters/ on sys.path and ships capstone by value; definitions() keeps only its
# imports, so the path is set here and each wrong answer registers capstone again.
if str(ROOT / "chapters") not in sys.path:
    sys.path.insert(0, str(ROOT / "chapters"))
_GIVEN = "\ncloudpickle.register_pickle_by_value(capstone)\ntorch.set_num_threads(1)\n"

_BATCH = '''
def get_batch(data, rank, world_size, step, batch_size, block_size, seed):
    generator = torch.Generator().manual_seed({seed})
    offsets = {draw}[: world_size * batch_size]
    mine = offsets[rank * batch_size:(rank + 1) * batch_size].tolist()
    rows = torch.stack([data[o:o + block_size + 1] for o in mine]).long()
    return rows[:, :-1], {y}
'''
_RIGHT = dict(seed="seed * 1_000_003 + step", draw="torch.randperm(len(data) - block_size, generator=generator)",
              y="rows[:, 1:]")


def _batch(**changes):
    return _BATCH.format(**{**_RIGHT, **changes})


_STEP = '''
def train_step(model, x, y, optimizer, grad_clip):
    _, loss = model(x, y)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    {before}
    params = [p for p in model.parameters() if p.grad is not None]
    flat = torch.cat([p.grad.reshape(-1) for p in params])
    {reduce}
    for p, g in zip(params, flat.split([p.numel() for p in params])):
        p.grad.copy_(g.view_as(p))
    {after}
    optimizer.step()
    {loss}
'''
_STEP_RIGHT = dict(before="", reduce="dist.all_reduce(flat)\n    flat /= dist.get_world_size()",
                   after="torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)",
                   loss="total = loss.detach().clone()\n    dist.all_reduce(total)\n"
                        "    return total.item() / dist.get_world_size()")


def _step(**changes):
    return _STEP.format(**{**_STEP_RIGHT, **changes})


_MISTAKES = [
    Mistake("10.1", "the generator seeded with the rank", _batch(seed="seed * 1_000_003 + 1009 * step + rank"),
            ("seeded with seed and step only (not the rank)", "keep rows rank * batch_size")),
    Mistake("10.1", "offsets drawn with replacement (torch.randint)", _batch(
        draw="torch.randint(len(data) - block_size, (world_size * batch_size,), generator=generator)"),
            ("some twice", "without replacement (torch.randperm)")),
    Mistake("10.1", "targets not shifted (y = x)", _batch(y="rows[:, :-1]"),
            ("y must be x shifted by one token", "y = data[o + 1:o + block_size + 1]")),
    Mistake("10.1", "the global generator seeded", _batch(seed="seed * 1_000_003 + step").replace(
        "generator = torch.Generator().manual_seed(", "torch.manual_seed(").replace(", generator=generator)", ")"),
            ("changed torch's global random state", "your own torch.Generator()")),
    Mistake("10.1", "the step left out of the seed", _batch(seed="seed"),
            ("same batch at step 0, seed 0 and at step 1", "seed the generator with seed AND step")),

    Mistake("10.2", "the sum, not the mean", _step(reduce="dist.all_reduce(flat)"),
            ("SUM over the", "divide")),
    Mistake("10.2", "no all-reduce: each rank keeps its own gradient", _step(reduce="pass"),
            ("still this rank's own gradient", "all-reduce")),
    Mistake("10.2", "each rank clips its own gradient before averaging", _step(
        before="torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)", after="pass"),
            ("clipped to norm 0.05", "Clip AFTER averaging")),
    Mistake("10.2", "returns its own batch's loss", _step(loss="return loss.item()"),
            ("returned its own batch's loss", "return the")),

    Mistake("10.3", "no broadcast: every rank keeps its own initialisation", '''
def train_gpt(data, *, steps, batch_size, block_size, lr, grad_clip, seed, model_config):
    rank, world_size = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(seed + rank)
    model = GPT(model_config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.1)
    losses = []
    for step in range(steps):
        x, y = get_batch(data, rank, world_size, step, batch_size, block_size, seed)
        losses.append(train_step(model, x, y, optimizer, grad_clip))
    return {"losses": losses, "params": torch.cat([p.detach().reshape(-1) for p in model.parameters()]).cpu()}
''', ("differ from rank 0's", "broadcast them")),
]

MISTAKES = [Mistake(m.question, m.name, _GIVEN + m.override, m.first_line, m.run_fails) for m in _MISTAKES]
