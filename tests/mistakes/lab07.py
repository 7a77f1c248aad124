"""Lab 07 (ZeRO-1 and ZeRO-2): the shard arithmetic's off-by-ones, Adam's L2 for AdamW, unpadded collectives, the
usual slips of a ZeRO-2 loop (the sum for the mean, full gradients kept, the frozen layer in the flat parameter), and
of its torch.optim shape (the constructor's values for every group, the state remade, no defaults)."""
from helpers.grading.prepare.labgen import ROOT
from tests.mistakes import Mistake

SOLUTION = ROOT / "solutions" / "07_zero_1_and_2.ipynb"

# 7.2's solution split in two, so a mistake can replace the update or the all-gather alone.
_SHARD = '''
def _my_shard(params):
    rank, world_size = dist.get_rank(), dist.get_world_size()
    flat = torch.cat([p.detach().reshape(-1) for p in params])
    start, stop, pad = shard_range(flat.numel(), rank, world_size)
    return flat, torch.cat([flat[start:stop], flat.new_zeros(pad)])

def _gather_into(params, shard):
    gathered = shard.new_empty(dist.get_world_size() * shard.numel())
    dist.all_gather_single(gathered, shard)
    with torch.no_grad():
        offset = 0
        for p in params:
            p.copy_(gathered[offset : offset + p.numel()].view_as(p))
            offset += p.numel()
'''


def _adamw(decay="shard.mul_(1 - lr * weight_decay)", grad="grad_shard", correct=True):
    """zero_adamw_step with its weight decay, gradient or bias correction replaced."""
    corrections = ("(v.sqrt() / math.sqrt(1 - beta2**t)).add_(eps)", "-lr / (1 - beta1**t)") if correct else (
        "v.sqrt().add_(eps)", "-lr")
    return _SHARD + f'''
def zero_adamw_step(params, grad_shard, state, *, lr, weight_decay, betas=(0.9, 0.999), eps=1e-8):
    flat, shard = _my_shard(params)
    g = {grad}
    beta1, beta2 = betas
    state["step"] += 1
    t, m, v = state["step"], state["exp_avg"], state["exp_avg_sq"]
    {decay}
    m.lerp_(g, 1 - beta1)
    v.mul_(beta2).addcmul_(g, g, value=1 - beta2)
    denom = {corrections[0]}
    shard.addcdiv_(m, denom, value={corrections[1]})
    _gather_into(params, shard)
'''


_RANGE = '''
def shard_range(numel, rank, world_size):
    if not 0 <= rank < world_size:
        raise ValueError(rank)
    {body}
'''

_FLAT_GRAD = '''
    world_size = dist.get_world_size()
    flat = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in params])
    size = math.ceil(flat.numel() / world_size)
    flat = torch.cat([flat, flat.new_zeros(world_size * size - flat.numel())])
'''

_TRAIN = '''
def train_zero2(model, batches, *, lr, weight_decay):
    params = [p for p in model.parameters() if p.requires_grad]
    state = adam_state(params, dist.get_world_size())
    for x, y in batches:
        nn.functional.mse_loss(model(x), y).backward()
        grad_shard = reduce_scatter_gradients(params)
        zero_adamw_step(params, grad_shard, state, lr=lr, weight_decay=weight_decay)
    return state
'''


def _zero_adamw(init='super().__init__(params, {"lr": lr, "betas": betas, "eps": eps, "weight_decay": weight_decay})',
                trainable="[p for p in group[\"params\"] if p.requires_grad]", state=None, grad_shard=None,
                values='lr=group["lr"], weight_decay=group["weight_decay"], betas=group["betas"], eps=group["eps"]'):
    """Lab 7.5's answer with one piece changed: the constructor, the parameters, the state, the gradient or values."""
    state = state or '''state = self.state[f"group {index}"]
            if not state:
                state.update(adam_state(params, dist.get_world_size()))'''
    return f'''
class ZeroAdamW(torch.optim.Optimizer):
    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2):
        {init}

    @torch.no_grad()
    def step(self, closure=None):
        for index, group in enumerate(self.param_groups):
            params = {trainable}
            {state}
            grad_shard = {grad_shard or "reduce_scatter_gradients(params)"}
            zero_adamw_step(params, grad_shard, state, {values})
'''


MISTAKES = [
    Mistake("7.1", "start not clipped: a shard past the end starts past numel", _RANGE.format(body='''
    size = math.ceil(numel / world_size)
    start = rank * size
    stop = min(start + size, numel)
    return start, stop, size - (stop - start)'''), ("starts past the end", "min(rank * s, numel)")),
    Mistake("7.1", "floor split, the rest on the last rank (no padding)", _RANGE.format(body='''
    size = numel // world_size
    stop = numel if rank == world_size - 1 else (rank + 1) * size
    return rank * size, stop, 0'''), ("numel // world_size", "ceil(numel / world_size)")),
    Mistake("7.1", "ceil written as numel // world_size + 1", _RANGE.format(body='''
    size = numel // world_size + 1
    start = min(rank * size, numel)
    stop = min(start + size, numel)
    return start, stop, size - (stop - start)'''), ("numel // world_size + 1", "math.ceil")),
    Mistake("7.1", "all the padding counted on every rank", _RANGE.format(body='''
    size = math.ceil(numel / world_size)
    start = min(rank * size, numel)
    stop = min(start + size, numel)
    return start, stop, size * world_size - numel'''), ("padding of the whole flat parameter", "s - (stop - start)")),
    Mistake("7.1", "no check of the rank", '''
def shard_range(numel, rank, world_size):
    size = math.ceil(numel / world_size)
    start = min(rank * size, numel)
    stop = min(start + size, numel)
    return start, stop, size - (stop - start)
''', ("should raise ValueError", "rank must be in 0 .. world_size - 1")),

    Mistake("7.2", "weight decay added to the gradient (Adam's L2, not AdamW)",
            _adamw(decay="pass", grad="grad_shard + weight_decay * shard"),
            ("L2 penalty added to the gradient", "p *= 1 - lr * weight_decay")),
    Mistake("7.2", "weight decay without the learning rate", _adamw(decay="shard.mul_(1 - weight_decay)"),
            ("weight decay without the learning rate", "1 - lr * weight_decay")),
    Mistake("7.2", "no bias correction", _adamw(correct=False),
            ("without the bias corrections", "1 - beta1**t")),
    Mistake("7.2", "a torch.optim.AdamW made in every call (the state starts from zero)", _SHARD + '''
def zero_adamw_step(params, grad_shard, state, *, lr, weight_decay, betas=(0.9, 0.999), eps=1e-8):
    flat, shard = _my_shard(params)
    shard = nn.Parameter(shard)
    shard.grad = grad_shard
    torch.optim.AdamW([shard], lr=lr, weight_decay=weight_decay, betas=betas, eps=eps).step()
    state["step"] += 1
    _gather_into(params, shard.detach())
''', ("moments start from zero in every call", "state['exp_avg']")),
    Mistake("7.2", "all-reduce of a zero-filled flat parameter instead of an all-gather",
            _adamw().replace("    _gather_into(params, shard)\n", '''
    rank, size = dist.get_rank(), shard.numel()
    full = flat.new_zeros(dist.get_world_size() * size)
    full[rank * size : (rank + 1) * size] = shard
    dist.all_reduce(full)
    with torch.no_grad():
        torch.nn.utils.vector_to_parameters(full[: flat.numel()], params)
'''), ("all_reduce", "dist.all_gather_single")),
    Mistake("7.2", "the shard not padded: ranks gather unequal sizes",
            _adamw().replace("flat.new_zeros(pad)", "flat.new_zeros(0)"),
            ("not padded", "`pad` zeros"), run_fails=True),

    Mistake("7.3", "the sum, not the mean", '''
_reduce = reduce_scatter_gradients

def reduce_scatter_gradients(params):
    return _reduce(params) * dist.get_world_size()
''', ("SUM over the 3 ranks", "divide by the world size")),
    Mistake("7.3", "all-reduce the whole gradient, then slice (ZeRO-1 as often drawn)", '''
def reduce_scatter_gradients(params):''' + _FLAT_GRAD + '''
    dist.all_reduce(flat)
    for p in params:
        p.grad = None
    rank = dist.get_rank()
    return flat[rank * size : (rank + 1) * size].clone() / world_size
''', ("all_reduce", "one reduce_scatter")),
    Mistake("7.3", "a missing .grad skipped", '''
def reduce_scatter_gradients(params):
    world_size = dist.get_world_size()
    flat = torch.cat([p.grad.reshape(-1) for p in params if p.grad is not None])
    size = math.ceil(flat.numel() / world_size)
    flat = torch.cat([flat, flat.new_zeros(world_size * size - flat.numel())])
    shard = flat.new_empty(size)
    dist.reduce_scatter_single(shard, flat)
    for p in params:
        p.grad = None
    return shard / world_size
''', ("zeros for a missing gradient",), run_fails=True),
    Mistake("7.3", "the flat gradient not padded", '''
def reduce_scatter_gradients(params):
    world_size = dist.get_world_size()
    flat = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in params])
    shard = flat.new_empty(math.ceil(flat.numel() / world_size))
    dist.reduce_scatter_single(shard, flat)
    for p in params:
        p.grad = None
    return shard / world_size
''', ("not padded", "world_size * s"), run_fails=True),
    Mistake("7.3", "the full gradients kept (zeroed, not freed)", '''
def reduce_scatter_gradients(params):''' + _FLAT_GRAD + '''
    shard = flat.new_empty(size)
    dist.reduce_scatter_single(shard, flat)
    for p in params:
        if p.grad is not None:
            p.grad.zero_()
    return shard / world_size
''', ("still have a .grad", "p.grad = None")),

    Mistake("7.4", "no gradient communication: each rank steps with its own gradient", '''
def train_zero2(model, batches, *, lr, weight_decay):
    params = [p for p in model.parameters() if p.requires_grad]
    rank, world_size = dist.get_rank(), dist.get_world_size()
    state = adam_state(params, world_size)
    for x, y in batches:
        nn.functional.mse_loss(model(x), y).backward()
        flat = torch.cat([p.grad.reshape(-1) for p in params])
        start, stop, pad = shard_range(flat.numel(), rank, world_size)
        for p in params:
            p.grad = None
        zero_adamw_step(params, torch.cat([flat[start:stop], flat.new_zeros(pad)]), state, lr=lr,
                        weight_decay=weight_decay)
    return state
''', ("no reduce_scatter", "call reduce_scatter_gradients")),
    Mistake("7.4", "the frozen layer in the flat parameter", _TRAIN.replace(
        "params = [p for p in model.parameters() if p.requires_grad]",
        "model.requires_grad_(True)\n    params = list(model.parameters())"),
            ("frozen first layer changed", "requires_grad=True")),
    Mistake("7.4", "the state made anew every step", _TRAIN.replace(
        "    state = adam_state(params, dist.get_world_size())\n", "").replace(
        "        nn.functional", "        state = adam_state(params, dist.get_world_size())\n        nn.functional"),
            ("state['step'] is 1 after 4 steps", "once, before the loop")),
    Mistake("7.4", "weight_decay not passed on", _TRAIN.replace("weight_decay=weight_decay)", "weight_decay=0.0)"),
            ("without weight decay", "pass weight_decay=weight_decay")),

    Mistake("7.5", "the constructor's values kept for every group (self.lr)", _zero_adamw(
        init='super().__init__(params, {"lr": lr, "betas": betas, "eps": eps, "weight_decay": weight_decay})\n'
             '        self.lr, self.betas, self.eps, self.weight_decay = lr, betas, eps, weight_decay',
        values="lr=self.lr, weight_decay=self.weight_decay, betas=self.betas, eps=self.eps"),
            ("constructor's lr and weight_decay", "group['lr']")),
    Mistake("7.5", "the frozen tensors in the flat parameter", _zero_adamw(trainable='list(group["params"])'),
            ("frozen first layer changed", "requires_grad=True")),
    Mistake("7.5", "the state made anew at every step", _zero_adamw(
        state="state = adam_state(params, dist.get_world_size())"), ("step counts", "made once")),
    Mistake("7.5", "no defaults given to the base constructor", _zero_adamw(init="super().__init__(params, {})"),
            ("param_groups' values", "super().__init__ as the defaults")),
    Mistake("7.5", "each rank's own gradient, sliced (no reduce-scatter)", _zero_adamw(grad_shard='''torch.cat([
                (p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in params])
            start, stop, pad = shard_range(grad_shard.numel(), dist.get_rank(), dist.get_world_size())
            grad_shard = torch.cat([grad_shard[start:stop], grad_shard.new_zeros(pad)])'''),
            ("no reduce_scatter", "call reduce_scatter_gradients(params)")),
]
