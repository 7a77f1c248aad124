"""Lab 03 (manual DDP): the mistakes of 3.1 to 3.4, from chapter 03's own first versions and from trying."""
from helpers.grading.prepare.labgen import ROOT
from tests.mistakes import Mistake

SOLUTION = ROOT / "solutions" / "03_manual_ddp.ipynb"

_ORDER = '''
def _order(num_samples, shuffle, seed, epoch):
    if shuffle:
        return torch.randperm(num_samples, generator=torch.Generator().manual_seed(seed + epoch)).tolist()
    return list(range(num_samples))
'''

MISTAKES = [
    Mistake("3.1", "strided, neither padded nor cut", _ORDER + '''
def shard_indices(num_samples, rank, world_size, *, shuffle, seed, epoch, drop_last):
    if not 0 <= rank < world_size:
        raise ValueError(rank)
    return _order(num_samples, shuffle, seed, epoch)[rank::world_size]
''', ("padding is missing", "repeat the order from its start")),
    Mistake("3.1", "pads once (chapter 03's version)", _ORDER + '''
def shard_indices(num_samples, rank, world_size, *, shuffle, seed, epoch, drop_last):
    if not 0 <= rank < world_size:
        raise ValueError(rank)
    order = _order(num_samples, shuffle, seed, epoch)
    if drop_last:
        order = order[: num_samples // world_size * world_size]
    else:
        order = order + order[: math.ceil(num_samples / world_size) * world_size - num_samples]
    return order[rank::world_size]
''', ("fewer samples than ranks", "wrapping around")),
    Mistake("3.1", "contiguous blocks instead of every world_size-th index", _ORDER + '''
def shard_indices(num_samples, rank, world_size, *, shuffle, seed, epoch, drop_last):
    if not 0 <= rank < world_size:
        raise ValueError(rank)
    order = _order(num_samples, shuffle, seed, epoch)
    per_rank = num_samples // world_size if drop_last else math.ceil(num_samples / world_size)
    order = (order * (per_rank * world_size // num_samples + 1))[: per_rank * world_size]
    return order[rank * per_rank : (rank + 1) * per_rank]
''', ("contiguous block", "every world_size-th index")),
    Mistake("3.1", "shuffle seeded without the epoch", _ORDER.replace("seed + epoch", "seed") + '''
def shard_indices(num_samples, rank, world_size, *, shuffle, seed, epoch, drop_last):
    if not 0 <= rank < world_size:
        raise ValueError(rank)
    order = _order(num_samples, shuffle, seed, epoch)
    if drop_last:
        order = order[: num_samples // world_size * world_size]
    else:
        total = math.ceil(num_samples / world_size) * world_size
        while len(order) < total:
            order += order[: total - len(order)]
    return order[rank::world_size]
''', ("same order in every epoch", "seed + epoch")),
    Mistake("3.1", "no check of the rank", _ORDER + '''
def shard_indices(num_samples, rank, world_size, *, shuffle, seed, epoch, drop_last):
    order = _order(num_samples, shuffle, seed, epoch)
    if drop_last:
        order = order[: num_samples // world_size * world_size]
    else:
        total = math.ceil(num_samples / world_size) * world_size
        while len(order) < total:
            order += order[: total - len(order)]
    return order[rank::world_size]
''', ("should raise ValueError", "rank must be in 0 .. world_size - 1")),

    Mistake("3.2", "parameters only, no buffers", '''
def broadcast_parameters(model, src=0):
    with torch.no_grad():
        for p in model.parameters():
            dist.broadcast(p, src=src)
''', ("buffer", "broadcast model.buffers() too")),
    Mistake("3.2", "broadcast outside torch.no_grad()", '''
def broadcast_parameters(model, src=0):
    for t in [*model.parameters(), *model.buffers()]:
        dist.broadcast(t, src=src)
''', ("autograd recorded", "under torch.no_grad()")),
    Mistake("3.2", "only the source rank calls broadcast", '''
def broadcast_parameters(model, src=0):
    if dist.get_rank() == src:
        with torch.no_grad():
            for t in [*model.parameters(), *model.buffers()]:
                dist.broadcast(t, src=src)
''', ("every rank must call dist.broadcast",), run_fails=True),
    Mistake("3.2", "src ignored: always from rank 0", '''
def broadcast_parameters(model, src=0):
    with torch.no_grad():
        for t in [*model.parameters(), *model.buffers()]:
            dist.broadcast(t, src=0)
''', ("not rank 1's", "src=src")),
    Mistake("3.2", "new tensors instead of copying in place", '''
def broadcast_parameters(model, src=0):
    with torch.no_grad():
        for module in model.modules():
            for name, p in list(module.named_parameters(recurse=False)):
                t = p.detach().clone()
                dist.broadcast(t, src=src)
                setattr(module, name, nn.Parameter(t))
            for name, b in list(module.named_buffers(recurse=False)):
                dist.broadcast(b, src=src)
''', ("replaced", "in place")),

    Mistake("3.3", "chapter 03's loop: one all-reduce per tensor, skips a missing .grad, no division", '''
def average_gradients(model):
    for p in model.parameters():
        if p.requires_grad and p.grad is not None:
            dist.all_reduce(p.grad)
''', ("skipped that parameter", "count a missing .grad as zeros", "SUM", "divide by the world size"),
            run_fails=True),
    Mistake("3.3", "sum without the division", '''
def average_gradients(model):
    params = [p for p in model.parameters() if p.requires_grad]
    grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
    flat = _flatten_dense_tensors(grads)
    dist.all_reduce(flat)
    for p, total in zip(params, _unflatten_dense_tensors(flat, grads)):
        p.grad = total.clone()
''', ("SUM over the 3 ranks", "divide by the world size")),
    Mistake("3.3", "one all-reduce per parameter, otherwise right", '''
def average_gradients(model):
    for p in model.parameters():
        if p.requires_grad:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            dist.all_reduce(p.grad)
            p.grad /= dist.get_world_size()
''', ("4 all_reduce calls", "one buffer and all-reduce it once")),
    Mistake("3.3", "flat buffer of the gradients that exist (a missing .grad skipped)", '''
def average_gradients(model):
    params = [p for p in model.parameters() if p.requires_grad and p.grad is not None]
    grads = [p.grad for p in params]
    flat = _flatten_dense_tensors(grads)
    dist.all_reduce(flat)
    flat /= dist.get_world_size()
    for p, averaged in zip(params, _unflatten_dense_tensors(flat, grads)):
        p.grad.copy_(averaged)
''', ("skipped that parameter", "count a missing .grad as zeros"), run_fails=True),
    Mistake("3.3", "averages the parameters (the picotron hook bug)", '''
def average_gradients(model):
    params = [p for p in model.parameters() if p.requires_grad]
    with torch.no_grad():
        flat = _flatten_dense_tensors([p.detach() for p in params])
        dist.all_reduce(flat)
        flat /= dist.get_world_size()
        for p, averaged in zip(params, _unflatten_dense_tensors(flat, params)):
            p.copy_(averaged)
''', ("changed the parameters", "average the gradients (p.grad)")),
    Mistake("3.3", "frozen parameters in the buffer", '''
def average_gradients(model):
    params = list(model.parameters())
    grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
    flat = _flatten_dense_tensors(grads)
    dist.all_reduce(flat)
    flat /= dist.get_world_size()
    for p, averaged in zip(params, _unflatten_dense_tensors(flat, grads)):
        p.grad = averaged.clone()
''', ("frozen parameter", "leave frozen parameters out")),

    Mistake("3.4", "no broadcast: every rank keeps its own initialisation", '''
def train_manual_ddp(model, X, Y, *, epochs, batch_size, lr, seed):
    rank, world_size = dist.get_rank(), dist.get_world_size()
    losses = []
    for epoch in range(epochs):
        mine = shard_indices(len(X), rank, world_size, shuffle=True, seed=seed, epoch=epoch, drop_last=True)
        for start in range(0, len(mine), batch_size):
            idx = mine[start : start + batch_size]
            loss = nn.functional.mse_loss(model(X[idx]), Y[idx])
            model.zero_grad()
            loss.backward()
            average_gradients(model)
            with torch.no_grad():
                for p in model.parameters():
                    p -= lr * p.grad
            losses.append(loss.item())
    return losses
''', ("no broadcast", "broadcast_parameters(model, src=0)")),
    Mistake("3.4", "the same shuffle every epoch (epoch not passed)", '''
_train = train_manual_ddp
_shard = shard_indices

def train_manual_ddp(model, X, Y, **kwargs):
    global shard_indices
    shard_indices = lambda n, rank, world_size, *, epoch, **kw: _shard(n, rank, world_size, epoch=0, **kw)
    try:
        return _train(model, X, Y, **kwargs)
    finally:
        shard_indices = _shard
''', ("same order in every epoch", "epoch=epoch")),
    Mistake("3.4", "gradients never zeroed", '''
def train_manual_ddp(model, X, Y, *, epochs, batch_size, lr, seed):
    rank, world_size = dist.get_rank(), dist.get_world_size()
    broadcast_parameters(model, src=0)
    losses = []
    for epoch in range(epochs):
        mine = shard_indices(len(X), rank, world_size, shuffle=True, seed=seed, epoch=epoch, drop_last=True)
        for start in range(0, len(mine), batch_size):
            idx = mine[start : start + batch_size]
            loss = nn.functional.mse_loss(model(X[idx]), Y[idx])
            loss.backward()
            average_gradients(model)
            with torch.no_grad():
                for p in model.parameters():
                    p -= lr * p.grad
            losses.append(loss.item())
    return losses
''', ("gradients accumulate", "zero the gradients")),
    Mistake("3.4", "drop_last=False: padded shards", '''
def train_manual_ddp(model, X, Y, *, epochs, batch_size, lr, seed):
    rank, world_size = dist.get_rank(), dist.get_world_size()
    broadcast_parameters(model, src=0)
    losses = []
    for epoch in range(epochs):
        mine = shard_indices(len(X), rank, world_size, shuffle=True, seed=seed, epoch=epoch, drop_last=False)
        for start in range(0, len(mine), batch_size):
            idx = mine[start : start + batch_size]
            loss = nn.functional.mse_loss(model(X[idx]), Y[idx])
            model.zero_grad()
            loss.backward()
            average_gradients(model)
            with torch.no_grad():
                for p in model.parameters():
                    p -= lr * p.grad
            losses.append(loss.item())
    return losses
''', ("drop_last=True",)),
    Mistake("3.4", "steps before averaging", '''
def train_manual_ddp(model, X, Y, *, epochs, batch_size, lr, seed):
    rank, world_size = dist.get_rank(), dist.get_world_size()
    broadcast_parameters(model, src=0)
    losses = []
    for epoch in range(epochs):
        mine = shard_indices(len(X), rank, world_size, shuffle=True, seed=seed, epoch=epoch, drop_last=True)
        for start in range(0, len(mine), batch_size):
            idx = mine[start : start + batch_size]
            loss = nn.functional.mse_loss(model(X[idx]), Y[idx])
            model.zero_grad()
            loss.backward()
            with torch.no_grad():
                for p in model.parameters():
                    p -= lr * p.grad
            average_gradients(model)
            losses.append(loss.item())
    return losses
''', ("before average_gradients", "average, then step")),
]
