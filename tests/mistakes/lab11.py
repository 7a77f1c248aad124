"""Lab 11 (operating data parallelism): the mistakes of 11.1 to 11.4: the planted failures themselves, and what
fixing them half-way gives."""
from helpers.grading.prepare.labgen import ROOT
from tests.mistakes import Mistake

SOLUTION = ROOT / "solutions" / "11_operations.ipynb"

_LOOP_TAIL = '''
        model.zero_grad()
        loss.backward()
        average_gradients(model)
        with torch.no_grad():
            for p in model.parameters():
                p -= lr * p.grad
    return max_steps
'''

def _train_ddp(wrap="DDP(model, find_unused_parameters=True)", forward="ddp(X)", loss=None):
    """Lab 11.3's answer with one piece changed: the wrapping, the forward call or the loss."""
    return f'''
def train_ddp(model, X, Y, *, lr, steps):
    ddp = {wrap}
    optimizer = torch.optim.SGD(ddp.parameters(), lr=lr)
    for _ in range(steps):
        loss = {loss or f"F.mse_loss({forward}, Y)"}
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
'''


_SAVE = '''
def save_checkpoint(path, model, optimizer, next_step):
    rng_states = [None] * dist.get_world_size()
    dist.all_gather_object(rng_states, torch.get_rng_state())
    if dist.get_rank() == 0:
        state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "next_step": next_step,
                 "rng": rng_states}
        torch.save(state, path + ".tmp")
        os.replace(path + ".tmp", path)
    dist.barrier()
'''

_LOAD = '''
def load_checkpoint(path, model, optimizer):
    state = torch.load(path, weights_only=True)
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    torch.set_rng_state(state["rng"][dist.get_rank()])
    return state["next_step"]
'''

MISTAKES = [
    Mistake("11.1", "the given version: bincount without minlength", "class_counts = class_counts_given",
            ("differ in shape", "minlength=num_classes"), run_fails=True),
    Mistake("11.1", "this rank's counts, never all-reduced", '''
def class_counts(labels, num_classes):
    return torch.bincount(labels, minlength=num_classes)
''', ("its own counts", "all_reduce them (SUM)")),
    Mistake("11.1", "averaged like gradients", '''
def class_counts(labels, num_classes):
    counts = torch.bincount(labels, minlength=num_classes)
    dist.all_reduce(counts)
    return counts // dist.get_world_size()
''', ("divided by the world size", "SUM")),
    Mistake("11.1", "op=MAX", '''
def class_counts(labels, num_classes):
    counts = torch.bincount(labels, minlength=num_classes)
    dist.all_reduce(counts, op=dist.ReduceOp.MAX)
    return counts
''', ("MAX", "SUM")),
    Mistake("11.1", "float counts from one_hot", '''
def class_counts(labels, num_classes):
    counts = F.one_hot(labels, num_classes).sum(0).float()
    dist.all_reduce(counts)
    return counts
''', ("float32", "int64")),

    Mistake("11.2", "the given version: each rank stops on its own loss", "train_until = train_until_given",
            ("stopped at different steps", "decide on the mean loss over ranks"), run_fails=True),
    Mistake("11.2", "the sum of the losses, not the mean", '''
def train_until(model, X, Y, *, target, lr, max_steps):
    for step in range(max_steps):
        loss = F.mse_loss(model(X), Y)
        total = loss.detach().clone()
        dist.all_reduce(total)
        if total.item() < target:
            return step
''' + _LOOP_TAIL, ("SUM of the losses", "divide by the world size")),
    Mistake("11.2", "rank 0's loss, broadcast", '''
def train_until(model, X, Y, *, target, lr, max_steps):
    for step in range(max_steps):
        loss = F.mse_loss(model(X), Y)
        first = loss.detach().clone()
        dist.broadcast(first, src=0)
        if first.item() < target:
            return step
''' + _LOOP_TAIL, ("rank 0's loss", "mean over ranks")),
    Mistake("11.2", "the mean loss, but the gradients never averaged", '''
def train_until(model, X, Y, *, target, lr, max_steps):
    for step in range(max_steps):
        loss = F.mse_loss(model(X), Y)
        total = loss.detach().clone()
        dist.all_reduce(total)
        if total.item() / dist.get_world_size() < target:
            return step
        model.zero_grad()
        loss.backward()
        with torch.no_grad():
            for p in model.parameters():
                p -= lr * p.grad
    return max_steps
''', ("differ from rank 0's", "average_gradients")),

    Mistake("11.3", "the given version: plain DDP", "train_ddp = train_ddp_given",
            ("aux_head got none", "find_unused_parameters=True"), run_fails=True),
    Mistake("11.3", "no DDP at all", _train_ddp(wrap="model", forward="ddp(X)"),
            ("its own gradient", "call the DDP wrapper")),
    Mistake("11.3", "forward through ddp.module, so DDP's hooks never run", _train_ddp(forward="ddp.module(X)"),
            ("its own gradient", "not the bare model or ddp.module")),
    Mistake("11.3", "the loss divided by the world size, as if DDP summed",
            _train_ddp(loss="F.mse_loss(ddp(X), Y) / dist.get_world_size()"),
            ("divided by the world size", "DDP already averages")),

    Mistake("11.4", "no random state in the checkpoint", '''
def save_checkpoint(path, model, optimizer, next_step):
    if dist.get_rank() == 0:
        torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "next_step": next_step},
                   path + ".tmp")
        os.replace(path + ".tmp", path)
    dist.barrier()

def load_checkpoint(path, model, optimizer):
    state = torch.load(path, weights_only=True)
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    return state["next_step"]
''', ("random state was not restored", "torch.set_rng_state")),
    Mistake("11.4", "rank 0's random state restored on every rank", '''
def save_checkpoint(path, model, optimizer, next_step):
    if dist.get_rank() == 0:
        torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "next_step": next_step,
                    "rng": torch.get_rng_state()}, path + ".tmp")
        os.replace(path + ".tmp", path)
    dist.barrier()

def load_checkpoint(path, model, optimizer):
    state = torch.load(path, weights_only=True)
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    torch.set_rng_state(state["rng"])
    return state["next_step"]
''', ("rank 0's random state", "dist.all_gather_object")),
    Mistake("11.4", "the model only, no optimizer state",
            _SAVE + _LOAD.replace('    optimizer.load_state_dict(state["optimizer"])\n', ""),
            ("momentum was not restored", "optimizer.load_state_dict")),
    Mistake("11.4", "torch.save straight to path: a crash mid-save leaves half a file", _SAVE.replace(
        '''torch.save(state, path + ".tmp")
        os.replace(path + ".tmp", path)''', "torch.save(state, path)") + _LOAD,
            ("left `path` unreadable", "os.replace(path + '.tmp', path)")),
    Mistake("11.4", "load_checkpoint returns nothing",
            _SAVE + _LOAD.replace('    return state["next_step"]\n', ""),
            ("load_checkpoint returned None", "return the saved next step")),
    Mistake("11.4", "the step just done saved, so the resume repeats it",
            (_SAVE + _LOAD).replace('"next_step": next_step,', '"step": next_step - 1,')
            .replace('state["next_step"]', 'state["step"]'),
            ("resumed at step 2", "save next_step and return it")),
]
