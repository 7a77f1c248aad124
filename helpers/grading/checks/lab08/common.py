"""Shared pieces of lab 08's checks: the memoized launches, the units of 8.1 to 8.4, the reference layout."""
import itertools

import torch
import torch.distributed as dist
from torch import nn

from helpers.errors import CollectiveHang, RankFailed
from helpers.grading.registry import answer
from helpers.grading.shared_run import launch_gloo as launch  # starts no ranks for a TODO
from helpers.grading.shared_run import run_failed

WORLD_SIZE = 3  # 8.2 to 8.4; 8.1 also runs on 4 ranks, 8.5 on 2, 3 and 4
HANG_S = 20.0  # a check whose ranks wait longer than this reports CollectiveHang instead of hanging
# float32 sums of the same numbers in another order differ by a few roundings of 2**-24 (chapter 08, section 5); SGD,
# unlike Adam, does not amplify that, so it stays far below 1e-6, and any real bug is far above.
TOL = 1e-6
BF16 = torch.bfloat16  # the compute dtype of the mixed-precision cases (FSDP2's MixedPrecisionPolicy.param_dtype)

_memo = {}  # question -> (key, (ok, value)) of the last launches for that question

# Added to every seed of the checks' units, data and gradients: 0 here. The grader's hidden tests run the same rank
# functions with it set from their secret seed (on the ranks), and the checks themselves on their results with the
# same value (in the grader: probes/judges.by_public_checks), so the feedback says what the check says.
OFFSET = 0
# What a run that did not finish says first (the grader's hidden tests say it too).
HINT = "Every rank must issue the same collectives, with tensors of the same sizes. "


def _results(question, key, fn, world_sizes, *args):
    """{world size: [rank results]} of fn(*args), launched once per key; a failure is re-raised by every check."""
    if question not in _memo or _memo[question][0] != key:
        try:
            outcome = True, {n: launch(fn, n, args=args, backend="gloo", hang_timeout=HANG_S) for n in world_sizes}
        except (CollectiveHang, RankFailed) as exc:
            if isinstance(exc, RankFailed) and exc.exitcode is None:
                outcome = False, exc  # an exception in the student's code: its own message is the best report
            else:
                outcome = False, run_failed(exc, HINT)
        except Exception as exc:  # noqa: BLE001 - every check of the question reports the same failure
            outcome = False, exc
        _memo[question] = (key, outcome)
    ok, value = _memo[question][1]
    if not ok:
        raise value
    return value


def _method(ns, name):
    cls = answer(ns, "FlatShard")
    assert callable(getattr(cls, name, None)), f"FlatShard has no method `{name}`: run the cell that defines it"
    return cls, getattr(cls, name)


def _each(results, mixed=False):
    """(where, n, rank, got, s) for every world size n, rank and unit in float32 (mixed: in a compute dtype of its
    own, cases the mixed-precision checks read); s = elements per shard."""
    for n, ranks in results.items():
        for rank, result in enumerate(ranks):
            for case, got in result.items():
                if got.get("mixed", False) != mixed:
                    continue
                where = f"{case} unit ({got['numel']} parameters), rank {rank} of {n}"
                yield where, n, rank, got, -(-got["numel"] // n)


def _flat(tensors):
    return torch.cat([t.detach().reshape(-1) for t in tensors])


def _padded(flat, n):
    return torch.cat([flat, flat.new_zeros(-flat.numel() % n)])


def _diff(a, b):
    return (a.double() - b.double()).abs().max().item()


def _head(t):
    """The first elements of t, rounded: enough to see a wrong order in a message."""
    return [round(v, 4) for v in t.reshape(-1)[:4].tolist()]


def _error(exc):
    if isinstance(exc, NotImplementedError):
        raise exc
    return f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"


# --- the units of 8.1 to 8.4, and the reference layout -----------------------------------------------------------

def _block():
    """A nested unit: Linear(5, 4), LayerNorm(4), Tanh, Linear(4, 3): 47 parameters, all random."""
    torch.manual_seed(8 + OFFSET)
    block = nn.Sequential(nn.Linear(5, 4), nn.LayerNorm(4), nn.Tanh(), nn.Linear(4, 3))
    for p in block.parameters():
        nn.init.normal_(p)
    return block


def _tiny():
    torch.manual_seed(9 + 10 * OFFSET)
    return nn.Linear(1, 1)


UNITS = {"block": (_block, 5), "tiny": (_tiny, 1)}  # name -> (maker, input features)


def _ref_init(unit, module, param_dtype=None, reduce_dtype=None):
    """The layout 8.1 asks for, written onto `unit`, an instance of the student's class made without __init__."""
    rank, n = dist.get_rank(), dist.get_world_size()
    named = [(k.rpartition("."), p) for k, p in module.named_parameters() if not k.endswith("flat_shard")]
    unit.module, unit.param_infos = module, [(module.get_submodule(prefix), attr) for (prefix, _, attr), _ in named]
    unit.shapes, unit.numels = [p.shape for _, p in named], [p.numel() for _, p in named]
    unit.numel, size = sum(unit.numels), -(-sum(unit.numels) // n)
    unit.padded_numel = size * n
    flat = _padded(_flat(p for _, p in named), n)
    unit.flat_shard = nn.Parameter(flat[rank * size : (rank + 1) * size].clone())
    unit.param_dtype = param_dtype or flat.dtype
    unit.reduce_dtype = reduce_dtype or unit.param_dtype  # as FSDP2: None reduces in the compute dtype
    for owner, attr in unit.param_infos:
        delattr(owner, attr)
    module.register_parameter("flat_shard", unit.flat_shard)
    unit.flat = torch.zeros_like(flat, dtype=unit.param_dtype, requires_grad=True)
    unit.flat.untyped_storage().resize_(0)
    return unit


def _ref_unshard(unit):
    """Full parameters on `unit` for 8.3's checks (8.2 is checked against the original parameters, not this)."""
    gathered = torch.empty(unit.padded_numel, dtype=unit.param_dtype)  # (N * s,): rank r's shard at offset r * s
    dist.all_gather_single(gathered, unit.flat_shard.detach().to(unit.param_dtype))
    unit.flat.untyped_storage().resize_(gathered.untyped_storage().nbytes())
    unit.flat.data.copy_(gathered)  # through .data: the views autograd saved for backward keep their version
    for (owner, attr), start, numel, shape in zip(unit.param_infos, itertools.accumulate([0] + unit.numels),
                                                  unit.numels, unit.shapes):
        setattr(owner, attr, unit.flat[start:start + numel].view(shape))


def _case(cls, make, features, param_dtype=None, reduce_dtype=None):
    """(module, its unit by _ref_init, x, what a result holds: names, shapes, numel, the flat parameters and the
    padded flat gradient of (module(x)**2).sum()). With a param_dtype, x, the parameters and the gradient are in it
    (no hooks cast x here: the checks pass it in the compute dtype, as the given pre_forward does)."""
    module, reference, n = make(), make().to(param_dtype), dist.get_world_size()
    x = torch.randn(3, features, generator=torch.Generator().manual_seed(80 + OFFSET)).to(param_dtype)
    grads = torch.autograd.grad(reference(x).square().sum(), list(reference.parameters()))
    got = {"names": [k for k, _ in module.named_parameters()], "shapes": [tuple(p.shape) for p in module.parameters()],
           "original": _flat(module.parameters()).to(param_dtype), "grad": _padded(_flat(grads), n),
           "mixed": param_dtype is not None}
    got["numel"] = got["original"].numel()
    return module, _ref_init(object.__new__(cls), module, param_dtype, reduce_dtype), x, got
