"""Lab 01 (gradient averaging): the mistakes of 1.1 to 1.3, from chapter 01's naive averages and from trying."""
from helpers.grading.prepare.labgen import ROOT
from tests.mistakes import Mistake

SOLUTION = ROOT / "solutions" / "01_gradient_averaging.ipynb"

MISTAKES = [
    Mistake("1.1", "plain mean of the shards' gradients", '''
def weighted_mean_grads(grads, counts):
    if len(grads) != len(counts) or sum(counts) == 0:
        raise ValueError("bad input")
    if isinstance(grads[0], torch.Tensor):
        return torch.stack(grads).mean(0)
    return [torch.stack(parts).mean(0) for parts in zip(*grads)]
''', ("plain mean", "weight")),
    Mistake("1.1", "weights by counts without dividing by the total", '''
def weighted_mean_grads(grads, counts):
    if len(grads) != len(counts) or sum(counts) == 0:
        raise ValueError("bad input")
    kept = [(g, n) for g, n in zip(grads, counts) if n > 0]
    if isinstance(kept[0][0], torch.Tensor):
        return sum(g * n for g, n in kept)
    return [sum(g[i] * n for g, n in kept) for i in range(len(kept[0][0]))]
''', ("sum(counts)", "divide")),
    Mistake("1.1", "weights the inputs in place", '''
def weighted_mean_grads(grads, counts):
    if len(grads) != len(counts) or sum(counts) == 0:
        raise ValueError("bad input")
    total = sum(counts)
    kept = [(g, n / total) for g, n in zip(grads, counts) if n > 0]
    if isinstance(kept[0][0], torch.Tensor):
        return sum(g.mul_(w) for g, w in kept)
    return [sum(g[i].mul_(w) for g, w in kept) for i in range(len(kept[0][0]))]
''', ("modified the gradients it was given",)),
    Mistake("1.1", "keeps an empty shard's NaN gradient", '''
def weighted_mean_grads(grads, counts):
    total = sum(counts)
    if len(grads) != len(counts) or total == 0:
        raise ValueError("bad input")
    if isinstance(grads[0], torch.Tensor):
        return sum(g * (n / total) for g, n in zip(grads, counts))
    return [sum(g[i] * (n / total) for g, n in zip(grads, counts)) for i in range(len(grads[0]))]
''', ("NaN", "skip")),

    Mistake("1.2", "each rank's own token mean", '''
def global_token_mean_loss(token_losses, mask):
    mask = mask.float()
    return (token_losses * mask).sum() / mask.sum()
''', ("per-rank token means",)),
    Mistake("1.2", "global token count, but no world-size factor", '''
def global_token_mean_loss(token_losses, mask):
    mask = mask.float()
    total = mask.sum().detach()
    dist.all_reduce(total)
    return (token_losses * mask).sum() / total
''', ("multiply this rank's share of the loss by it",)),
    Mistake("1.2", "padding counted as tokens", '''
def global_token_mean_loss(token_losses, mask):
    total = torch.tensor(float(token_losses.numel()))
    dist.all_reduce(total)
    return token_losses.sum() * dist.get_world_size() / total
''', ("padding",)),

    Mistake("1.3", "plain average over ranks (chapter 01's DDP rule)", '''
def average_gradients(model, num_samples):
    for p in model.parameters():
        if p.grad is None:
            p.grad = torch.zeros_like(p)
        dist.all_reduce(p.grad)
        p.grad /= dist.get_world_size()
''', ("plain mean over ranks", "weight")),
    Mistake("1.3", "averages the parameters (the picotron bug)", '''
def average_gradients(model, num_samples):
    for p in model.parameters():
        if p.grad is None:
            p.grad = torch.zeros_like(p)
        with torch.no_grad():
            dist.all_reduce(p)
            p /= dist.get_world_size()
''', ("parameters",)),
    Mistake("1.3", "a rank without data skips the all-reduces", '''
def average_gradients(model, num_samples):
    total = torch.tensor([float(num_samples)])
    dist.all_reduce(total)
    for p in model.parameters():
        if p.grad is not None:
            p.grad.mul_(num_samples / total.item())
            dist.all_reduce(p.grad)
''', ("skipped", "p.grad None"), run_fails=True),
]
