"""Lab 12 (mixed precision): a scaler whose growth counter survives an overflow or grows a step late, a NaN taken for
finite, a flag never reset; ZeRO-2 ranks deciding alone or with the wrong reduction; autocast's copies and the
parameters counted as activations, copies counted at fp32's width; and the loop's order (clip before unscale, the
loss scaled twice, gradients never zeroed, no update)."""
from helpers.grading.prepare.labgen import ROOT
from tests.mistakes import Mistake

SOLUTION = ROOT / "solutions" / "12_mixed_precision.ipynb"

_UNSCALE = '''
        if self.found_inf is not None:
            raise RuntimeError("unscale_() has already been called on this optimizer since the last update()")
        inv_scale = torch.tensor(self.scale_factor, dtype=torch.float64).reciprocal().float()
        found_inf = False
        for group in optimizer.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    found_inf = found_inf or not bool(torch.isfinite(p.grad).all())
                    p.grad.mul_(inv_scale)
        self.found_inf = found_inf'''

_UPDATE = '''
        if self.found_inf:
            self.scale_factor *= self.backoff_factor
            self.growth_tracker = 0
        else:
            self.growth_tracker += 1
            if self.growth_tracker == self.growth_interval:
                self.scale_factor *= self.growth_factor
                self.growth_tracker = 0
        self.found_inf = None'''


def _scaler(unscale=_UNSCALE, update=_UPDATE):
    """Lab 12.1's LossScaler with its unscale_ or update body replaced."""
    return f'''
class LossScaler:
    def __init__(self, init_scale=2.0**16, growth_factor=2.0, backoff_factor=0.5, growth_interval=2000):
        self.scale_factor = float(init_scale)
        self.growth_factor, self.backoff_factor, self.growth_interval = growth_factor, backoff_factor, growth_interval
        self.growth_tracker = 0
        self.found_inf = None

    def scale(self, loss):
        return loss * self.scale_factor

    def unscale_(self, optimizer):{unscale}

    def step(self, optimizer):
        if self.found_inf is None:
            self.unscale_(optimizer)
        if not self.found_inf:
            optimizer.step()

    def update(self):{update}
'''


def _step(flag):
    """Lab 12.2's zero2_scaled_step with the handling of found_inf replaced."""
    return f'''
def zero2_scaled_step(params, optimizer, scaler):
    reduce_to_owners(params)
    scaler.unscale_(optimizer)
{flag}
    scaler.step(optimizer)
    broadcast_from_owners(params)
    scaler.update()
'''


def _counts(activations="ptr not in casts and ptr not in params", casts="c.untyped_storage().nbytes()",
            params="p.numel() * p.element_size()"):
    """Lab 12.3's autocast_bytes with one count replaced."""
    return f'''
def autocast_bytes(model, x, dtype):
    saved = []
    keep = torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t)
    with keep, ParamCasts() as log, torch.autocast(x.device.type, dtype=dtype or torch.bfloat16,
                                                    enabled=dtype is not None):
        model(x)
    params = {{p.untyped_storage().data_ptr() for p in model.parameters()}}
    casts = {{c.untyped_storage().data_ptr(): {casts} for c in log.casts}}
    storages = {{t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in saved}}
    return {{"params": sum({params} for p in model.parameters()),
            "casts": sum(casts.values()),
            "saved copies": sum(n for ptr, n in storages.items() if ptr in casts),
            "activations": sum(n for ptr, n in storages.items() if {activations})}}
'''


def _loop(body):
    """Lab 12.4's train_mixed with the body of its loop replaced."""
    return '''
def train_mixed(model, batches, scaler, *, lr, max_norm):
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    for x, y in batches:
        with torch.autocast(x.device.type, dtype=torch.float16):
            loss = F.cross_entropy(model(x), y)
''' + body + '''
    return optimizer
'''


MISTAKES = [
    Mistake("12.1", "growth counter not reset on overflow", _scaler(update=_UPDATE.replace(
        "            self.growth_tracker = 0\n        else:", "        else:")),
        ("growth counter is not reset on overflow", "growth_tracker = 0")),
    Mistake("12.1", "growth counted after the comparison (one step late)", _scaler(update='''
        if self.found_inf:
            self.scale_factor *= self.backoff_factor
            self.growth_tracker = 0
        elif self.growth_tracker == self.growth_interval:
            self.scale_factor *= self.growth_factor
            self.growth_tracker = 0
        else:
            self.growth_tracker += 1
        self.found_inf = None'''), ("grows one clean step late", "growth_tracker += 1")),
    Mistake("12.1", "torch.isinf: a NaN passes as finite", _scaler(unscale=_UNSCALE.replace(
        "not bool(torch.isfinite(p.grad).all())", "bool(torch.isinf(p.grad).any())")),
        ("holds a NaN and the step was not skipped", "torch.isfinite")),
    Mistake("12.1", "found_inf not reset by update()", _scaler(update=_UPDATE.replace(
        "        self.found_inf = None", "        pass")),
        ("repeats step 0's decision", "found_inf back to None")),
    Mistake("12.1", "the gradients never divided by the scale", _scaler(unscale=_UNSCALE.replace(
        "                    p.grad.mul_(inv_scale)\n", "")),
        ("differs from GradScaler's", "multiply every .grad by 1/S exactly once")),
    Mistake("12.1", "a second unscale_ divides again", _scaler(unscale=_UNSCALE.replace(
        '''        if self.found_inf is not None:
            raise RuntimeError("unscale_() has already been called on this optimizer since the last update()")
''', "")), ("second unscale_()", "raise RuntimeError")),
    Mistake("12.2", "found_inf not all-reduced: each rank decides on its own gradients", _step("    pass"),
            ("found_inf is only this rank's gradients'", "all-reduce it")),
    Mistake("12.2", "the flag all-reduced with MIN", _step('''
    flag = torch.tensor([1.0 if scaler.found_inf else 0.0], device=rank_device())
    dist.all_reduce(flag, op=dist.ReduceOp.MIN)
    scaler.found_inf = bool(flag.item())'''), ("no rank skipped", "MAX")),
    Mistake("12.3", "the weight copies counted as activations", _counts(activations="ptr not in params"),
            ("weight copies were counted as activations",)),
    Mistake("12.3", "the parameters counted as activations", _counts(activations="ptr not in casts"),
            ("parameters were counted as activations",)),
    Mistake("12.3", "the casts counted at 4 bytes an element", _counts(casts="4 * c.numel()"),
            ("counted at 4 bytes an element",)),
    Mistake("12.3", "the parameters counted at 2 bytes under autocast",
            _counts(params="p.numel() * (4 if dtype is None else 2)"),
            ("autocast does not convert the model",)),
    Mistake("12.4", "clipped before unscaling", _loop('''
        optimizer.zero_grad()
        scaler.scale(loss).backward()
        nn.utils.clip_grad_norm_(model.parameters(), max_norm)
        scaler.unscale_(optimizer)
        scaler.step(optimizer)
        scaler.update()'''), ("clipped while still scaled", "BEFORE clip_grad_norm_")),
    Mistake("12.4", "the loss scaled twice", _loop('''
        optimizer.zero_grad()
        scaler.scale(scaler.scale(loss)).backward()
        scaler.unscale_(optimizer)
        nn.utils.clip_grad_norm_(model.parameters(), max_norm)
        scaler.step(optimizer)
        scaler.update()'''), ("loss was scaled twice",)),
    Mistake("12.4", "the gradients never zeroed", _loop('''
        scaler.scale(loss).backward()
        scaler.unscale_(optimizer)
        nn.utils.clip_grad_norm_(model.parameters(), max_norm)
        scaler.step(optimizer)
        scaler.update()'''), ("gradients add up", "zero_grad")),
    Mistake("12.4", "scaler.update() never called", _loop('''
        optimizer.zero_grad()
        scaler.scale(loss).backward()
        scaler.unscale_(optimizer)
        nn.utils.clip_grad_norm_(model.parameters(), max_norm)
        scaler.step(optimizer)'''), ("unscale_() is being called after step()", "call scaler.update() once per step")),
]
