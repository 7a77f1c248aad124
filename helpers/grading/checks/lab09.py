"""Public checks of lab 09: choose a strategy for a memory budget, apply it with fully_shard or DDP, train inside it.

9.1 is a pure function, compared with the rule of the lab (fewest wire bytes among the strategies whose model states
fit, ties to the simpler one) on cases chosen so that each usual wrong answer gives another strategy. 9.2 and 9.3 run
the student's code through `helpers.launch` (Gloo, CPU) on a small residual MLP whose widths (10, 20) are not
multiples of 3 or 4, so FSDP pads its shards: byte counts are compared with `helpers.theory` evaluated on the
*padded* parameter count (exact), and the messages also give the unpadded formula (the tolerance is the padding).
"""
import math

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from helpers import theory
from helpers.comm import CommLedger
from helpers.errors import CollectiveHang, RankFailed
from helpers.grading.registry import answer, public_check
from helpers.launch import launch

HANG_TIMEOUT_S = 20.0
STRATEGY_ORDER = ("no_shard", "shard_grad_op", "hybrid_shard", "full_shard")
FP32_ADAM = {"k": 8, "param_bytes": 4, "grad_bytes": 4}  # fp32 parameters and gradients, Adam's two fp32 moments
LR, STEPS, BATCH = 0.01, 3, 6
TOL = 1e-5  # max |parameters - torch DDP's| after STEPS Adam steps (float32 sums in another order, through Adam)
D_IN, WIDTH, DEPTH, D_OUT = 5, 10, 2, 3
OPS = ("all_gather", "reduce_scatter", "all_reduce")


# --------------------------------------------------------------------------------------------- shared pieces
class Layer(nn.Module):
    """The checks' block type: a residual two-layer MLP."""

    def __init__(self, width):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(width, 2 * width), nn.Linear(2 * width, width)

    def forward(self, x):
        return x + self.fc2(torch.tanh(self.fc1(x)))


class Net(nn.Module):
    """embed -> DEPTH Layers -> head: the root unit holds embed and head."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Linear(D_IN, WIDTH)
        self.layers = nn.ModuleList(Layer(WIDTH) for _ in range(DEPTH))
        self.head = nn.Linear(WIDTH, D_OUT)

    def forward(self, x):
        x = self.embed(x)
        for layer in self.layers:
            x = layer(x)
        return self.head(x)


def make_net():
    torch.manual_seed(0)
    return Net()


def rank_batches(rank, steps=STEPS):
    """This rank's batches: different on every rank and at every step."""
    generator = torch.Generator().manual_seed(900 + rank)
    return [(torch.randn(BATCH, D_IN, generator=generator), torch.randn(BATCH, D_OUT, generator=generator))
            for _ in range(steps)]


def num_params(model):
    return sum(p.numel() for p in model.parameters())


def padded_num_params(model, shards):
    """Parameters counted as FSDP stores them: every dim 0 rounded up to a multiple of `shards`."""
    return sum(math.ceil(p.shape[0] / shards) * shards * (p.numel() // p.shape[0]) for p in model.parameters())


def reference_choose(num_params, world_size, budget, *, group_size=None, **convention):
    """The rule of 9.1: fewest wire bytes among the strategies that fit; ties to the earlier in STRATEGY_ORDER."""
    best = None
    for strategy in STRATEGY_ORDER:
        if strategy == "hybrid_shard" and group_size is None:
            continue
        g = group_size if strategy == "hybrid_shard" else None
        if theory.strategy_memory(num_params, world_size, strategy, group_size=g, **convention)["total"] > budget:
            continue
        sent = theory.comm_volume(strategy, num_params, world_size, group_size=g, kind="wire")
        if best is None or sent < best[0]:
            best = (sent, strategy)
    return best[1] if best else None


def run_on_ranks(fn, world_size, args, what):
    """launch() for checks: Gloo, short hang timeout; a hang or a crash becomes a failure that says what happened."""
    try:
        return launch(fn, world_size, args=args, backend="gloo", hang_timeout=HANG_TIMEOUT_S)
    except CollectiveHang as exc:
        raise AssertionError(f"{what} hung at world size {world_size} (no progress for {HANG_TIMEOUT_S:g} s): the "
                             f"ranks did not issue the same collectives. Launcher report:\n{exc}") from None
    except RankFailed as exc:
        if exc.exc_type == "NotImplementedError":
            raise
        raise AssertionError(f"{what} at world size {world_size}: a rank raised: {exc}") from None


def held(param):
    """Fraction of `param` this rank holds: 1.0 for a plain tensor, the local shard's share for a DTensor."""
    from torch.distributed.tensor import DTensor

    if isinstance(param, DTensor):
        return param.to_local().numel() / param.numel()
    return 1.0


# ------------------------------------------------------------------------------------------------ question 9.1
_GB = 1e9
# (label, args, kwargs): each case separates the right rule from at least one usual wrong answer.
CHOOSE_CASES = [
    ("1.5B on 32 ranks, 60 GB (DDP fits; ZeRO-2 sends the same bytes: the tie goes to DDP)",
     (1.5e9, 32, 60 * _GB), {"group_size": 8}),
    ("7B on 32 ranks, 60 GB", (7e9, 32, 60 * _GB), {"group_size": 8}),
    ("28B on 32 ranks, 60 GB, groups of 8", (28e9, 32, 60 * _GB), {"group_size": 8}),
    ("28B on 32 ranks, 60 GB, no group_size (hybrid_shard is not a candidate)", (28e9, 32, 60 * _GB), {}),
    ("40B on 32 ranks, 60 GB, groups of 8 (one copy per group of 8 needs 80 GB)", (40e9, 32, 60 * _GB),
     {"group_size": 8}),
    ("70B on 32 ranks, 60 GB, groups of 8", (70e9, 32, 60 * _GB), {"group_size": 8}),
    ("1B on 8 ranks, a budget of exactly 16 GB (<= fits)", (1e9, 8, 16 * _GB), {}),
    ("1B on 4 ranks, 8 GB, fp32 Adam (k=8, 4-byte parameters and gradients)", (1e9, 4, 8 * _GB), FP32_ADAM),
    ("200B on 32 ranks, 60 GB: nothing fits", (200e9, 32, 60 * _GB), {"group_size": 8}),
]


def _wrong_choices(args, kwargs):
    """{explanation: what that wrong rule returns} for one case."""
    psi, n, budget = args
    g = kwargs.get("group_size")
    convention = {k: v for k, v in kwargs.items() if k != "group_size"}
    candidates = [s for s in STRATEGY_ORDER if s != "hybrid_shard" or g is not None]

    def memory(s, group=None):
        group = group if s == "hybrid_shard" else None
        return theory.strategy_memory(psi, n, s, group_size=group, **convention)["total"]

    def pick(fits, cost, order=candidates):
        fitting = [s for s in order if fits(s)]
        return min(fitting, key=cost) if fitting else None

    wire = {s: theory.comm_volume(s, psi, n, group_size=g if s == "hybrid_shard" else None, kind="wire")
            for s in candidates}
    logical = {s: theory.comm_volume(s, psi, n, group_size=g if s == "hybrid_shard" else None)
               for s in candidates}
    return {
        "the strategy with the least memory: the rule is the least COMMUNICATION among those that fit":
            pick(lambda s: memory(s, g) <= budget, lambda s: memory(s, g)),
        "the fewest LOGICAL bytes (an all-gather over a group of 8 counts like one over 32): compare "
        "comm_volume(..., kind='wire'), the bytes each rank sends":
            pick(lambda s: memory(s, g) <= budget, logical.get),
        "hybrid_shard's memory over all ranks: it shards over group_size ranks only "
        "(strategy_memory(..., group_size=group_size))":
            pick(lambda s: memory(s, n if s == "hybrid_shard" else g) <= budget, wire.get),
        "a budget that must be strictly larger: a strategy that needs exactly the budget fits (<=)":
            pick(lambda s: memory(s, g) < budget, wire.get),
        "ZeRO-2 on a tie with DDP: equal bytes go to the EARLIER strategy in STRATEGY_ORDER (DDP)":
            pick(lambda s: memory(s, g) <= budget, wire.get, order=sorted(candidates, key=lambda s: s != "shard_grad_op")),
    }


@public_check("9.1")
def cheapest_strategy_that_fits(ns):
    choose = answer(ns, "choose_strategy")
    seen = []  # (args, kwargs, got) of the cases so far: a hint must explain all of them, not only the failing one
    for label, args, kwargs in CHOOSE_CASES:
        expected = reference_choose(*args, **kwargs)
        got = choose(*args, **kwargs)
        seen.append((args, kwargs, got))
        if got == expected:
            continue
        consistent = [why for why in _wrong_choices(args, kwargs)
                      if all(_wrong_choices(a, k)[why] == g for a, k, g in seen)]
        hint = f" That is what you get from {consistent[0]}." if consistent else ""
        if expected is None and got is not None:
            hint = " When no strategy fits, return None."
        raise AssertionError(f"{label}: expected {expected!r}, got {got!r}.{hint}")


@public_check("9.1")
def hybrid_needs_a_group_size(ns):
    choose = answer(ns, "choose_strategy")
    try:
        got = choose(28e9, 32, 60 * _GB)
    except ValueError as exc:
        raise AssertionError("without group_size, skip 'hybrid_shard' (theory raises for it without a group size): "
                             f"{exc}") from None
    assert got == "full_shard", f"28B on 32 ranks, 60 GB, no group_size: expected 'full_shard', got {got!r}"


# ------------------------------------------------------------------------------------------------ question 9.2
def _on_ranks_apply(apply_strategy, strategies):
    """Apply each strategy to a fresh Net, run forward and backward under a ledger; report what happened."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import FSDPModule
    from torch.distributed.tensor import DTensor
    from torch.nn.parallel import DistributedDataParallel as DDP

    rank, n = dist.get_rank(), dist.get_world_size()
    meshes = {1: init_device_mesh("cpu", (n,))}
    if "hybrid_shard" in strategies:
        meshes[2] = init_device_mesh("cpu", (2, n // 2), mesh_dim_names=("replicate", "shard"))
    x, y = rank_batches(rank, 1)[0]
    report = {}
    for strategy in strategies:
        model = make_net()
        configured = apply_strategy(model, meshes[2 if strategy == "hybrid_shard" else 1], strategy, (Layer,))
        if configured is None:
            report[strategy] = {"error": "apply_strategy returned None: return the model to train"}
            continue
        inner = configured.module if isinstance(configured, DDP) else configured
        with CommLedger() as ledger:
            with ledger.tag("forward"):
                loss = F.mse_loss(configured(x), y)
            after_forward = {"root": held(inner.embed.weight), "layer": held(inner.layers[0].fc1.weight)}
            with ledger.tag("backward"):
                loss.backward()
        weight = inner.layers[0].fc1.weight
        report[strategy] = {
            "ddp": isinstance(configured, DDP),
            "units": sorted(name or "(root)" for name, m in inner.named_modules() if isinstance(m, FSDPModule)),
            "placements": str(weight.placements) if isinstance(weight, DTensor) else None,
            "after_forward": after_forward,
            "records": [(r.op, r.label, r.payload_bytes, r.group_size) for r in ledger.records]}
    return report


def _count(records, op, phase=None):
    return sum(1 for r in records if r[0] == op and (phase is None or r[1] == phase))


def _payload(records, op):
    return sum(r[2] for r in records if r[0] == op)


def _check_sharded(strategy, report, world_size, shards):
    """The ledger and the held fractions of one fully_shard strategy on rank 0."""
    model = make_net()
    units = DEPTH + 1
    where = f"{strategy} on {world_size} ranks"
    got_units = report["units"]
    assert got_units == sorted(["(root)"] + [f"layers.{i}" for i in range(DEPTH)]), (
        f"{where}: the FSDP units are {got_units}; expected one per Layer (block_types) and the root: call "
        "fully_shard on every module of a block type first (deepest first), then on the root")
    records = report["records"]
    forward, backward = _count(records, "all_gather", "forward"), _count(records, "all_gather", "backward")
    resharded = strategy != "shard_grad_op"
    expected_backward = units if resharded else 0
    if backward != expected_backward:
        if resharded and backward == units - 1:
            why = ("the root was not resharded after forward: the default reshard_after_forward=None keeps the root "
                   "unsharded; pass reshard_after_forward=True to every unit, root included")
        elif resharded:
            why = "full sharding frees the parameters after forward: reshard_after_forward=True"
        else:
            why = "shard_grad_op keeps the gathered parameters until backward ends: reshard_after_forward=False"
        raise AssertionError(f"{where}: {backward} all-gathers in backward, expected {expected_backward} "
                             f"({units} units, {forward} all-gathers in forward): {why}")
    assert forward == units and _count(records, "reduce_scatter") == units, (
        f"{where}: expected {units} all-gathers in forward and {units} reduce-scatters, got {forward} and "
        f"{_count(records, 'reduce_scatter')}")
    # Rank 0 holds the first ceil(rows / shards) rows of a resharded parameter (the root's embed.weight has WIDTH
    # rows, a Layer's fc1.weight 2 * WIDTH), all of it when the parameters stay gathered.
    expected_held = {"root": math.ceil(WIDTH / shards) / WIDTH if resharded else 1.0,
                     "layer": math.ceil(2 * WIDTH / shards) / (2 * WIDTH) if resharded else 1.0}
    got_held = report["after_forward"]
    assert all(abs(got_held[k] - v) < 1e-9 for k, v in expected_held.items()), (
        f"{where}: right after forward rank 0 held these fractions of the root's and a Layer's parameters: "
        f"{got_held}; expected {expected_held} ({'resharded' if resharded else 'kept whole'} after forward)")
    psi, psi_padded = num_params(model), padded_num_params(model, shards)
    group = shards if strategy == "hybrid_shard" else None
    predicted = theory.comm_breakdown(strategy, psi_padded, world_size, group_size=group, bytes_per_element=4,
                                      kind="payload")
    unpadded = theory.comm_breakdown(strategy, psi, world_size, group_size=group, bytes_per_element=4, kind="payload")
    for op in OPS:
        got = _payload(records, op)
        assert got == predicted[op], (
            f"{where}: {op} payload {got} bytes; helpers.theory predicts {predicted[op]:.0f} on the padded parameter "
            f"count ({psi_padded}; unpadded {psi}: {unpadded[op]:.0f} bytes)")


_APPLY_STRATEGIES = ("no_shard", "shard_grad_op", "full_shard", "hybrid_shard")
_apply_cache = {}  # {apply_strategy function: rank 0's report}: both 9.2 checks share one launch


def _apply_report(apply_strategy):
    """Rank 0's report of every strategy on 4 ranks (one launch per function object)."""
    if apply_strategy not in _apply_cache:
        _apply_cache.clear()
        try:
            _apply_cache[apply_strategy] = run_on_ranks(
                _on_ranks_apply, 4, (apply_strategy, _APPLY_STRATEGIES),
                "apply_strategy (fully_shard the blocks first, deepest first, and the root last)")[0]
        except Exception as exc:  # noqa: BLE001 - the second check reports the same failure without a new launch
            _apply_cache[apply_strategy] = exc
    report = _apply_cache[apply_strategy]
    if isinstance(report, Exception):
        raise report
    for strategy, r in report.items():
        assert "error" not in r, f"{strategy}: {r['error']}"
    return report


@public_check("9.2")
def ddp_zero2_and_fsdp_on_a_1d_mesh(ns):
    report = _apply_report(answer(ns, "apply_strategy"))
    ddp = report["no_shard"]
    psi = num_params(make_net())
    assert ddp["ddp"] and not ddp["units"], (
        f"no_shard: expected torch DDP (DistributedDataParallel over mesh.get_group()), got "
        f"{'FSDP units ' + str(ddp['units']) if ddp['units'] else 'a model that is not DDP'}")
    assert _payload(ddp["records"], "all_reduce") == 4 * psi and not _count(ddp["records"], "all_gather"), (
        f"no_shard: expected all-reduces of 4 * {psi} bytes in total and no all-gather, got {ddp['records']}")
    for strategy in ("shard_grad_op", "full_shard"):
        assert not report[strategy]["ddp"], f"{strategy}: fully_shard the model, do not wrap it in DDP"
        _check_sharded(strategy, report[strategy], 4, 4)


@public_check("9.2")
def hsdp_on_a_2d_mesh(ns):
    report = _apply_report(answer(ns, "apply_strategy"))["hybrid_shard"]
    assert report["placements"] == "(Replicate(), Shard(dim=0))", (
        f"hybrid_shard on a 2 x 2 mesh: a Layer weight has placements {report['placements']}; expected "
        "(Replicate(), Shard(dim=0)): pass the 2-D mesh itself to fully_shard")
    groups = sorted({r[3] for r in report["records"] if r[0] == "all_gather"})
    assert groups == [2], f"hybrid_shard on 2 x 2: all-gathers should run over the shard groups of 2, got sizes {groups}"
    _check_sharded("hybrid_shard", report, 4, 2)


# ------------------------------------------------------------------------------------------------ question 9.3
def _on_ranks_train(train_within_budget, budget):
    """The student's training, then torch DDP with Adam on the same batches, for comparison."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    batches = rank_batches(dist.get_rank())
    result = train_within_budget(make_net, batches, budget, lr=LR, block_types=(Layer,))
    model = DDP(make_net())
    optimizer = torch.optim.Adam(model.parameters(), lr=LR)
    for x, y in batches:
        optimizer.zero_grad(set_to_none=True)
        F.mse_loss(model(x), y).backward()
        optimizer.step()
    return result, [p.detach().clone() for p in model.parameters()]


def _check_training(results, world_size, budget):
    model = make_net()
    psi, tensors = num_params(model), len(list(model.parameters()))
    expected = reference_choose(psi, world_size, budget, **FP32_ADAM)
    where = f"{world_size} ranks, budget {budget} bytes (Ψ = {psi} parameters, fp32 Adam: 16 bytes each under DDP)"
    first = results[0][0]
    assert isinstance(first, dict) and {"strategy", "state_bytes", "comm", "params"} <= set(first), (
        f"{where}: return a dict with keys 'strategy', 'state_bytes', 'comm', 'params'; got {type(first).__name__}")
    assert first["strategy"] == expected, (
        f"{where}: expected strategy {expected!r} (choose_strategy with k=8, param_bytes=4, grad_bytes=4), "
        f"got {first['strategy']!r}")
    shards = 1 if expected == "no_shard" else world_size
    psi_padded = padded_num_params(model, shards)
    low = theory.strategy_memory(psi, world_size, expected, **FP32_ADAM)
    high = theory.strategy_memory(psi_padded, world_size, expected, **FP32_ADAM)
    measured = first["state_bytes"]
    for rank, (result, _) in enumerate(results):
        total = result["state_bytes"]["total"]
        assert total <= budget, f"{where}: rank {rank} held {total} bytes of model state, over the budget"
    for category in ("params", "grads", "optimizer"):
        slack = 4 * tensors if category == "optimizer" else 0  # Adam's step counters: one 4-byte tensor each
        assert low[category] <= measured[category] <= high[category] + slack, (
            f"{where}: rank 0's largest '{category}' bytes were {measured[category]}; helpers.theory gives "
            f"{low[category]:.0f} ({high[category] + slack:.0f} with padding). Measure state_bytes(model, optimizer) "
            "after forward, after backward AND after the step of the first step, and keep each category's maximum "
            "(for shard_grad_op the parameters are whole only between forward and backward)")
    assert measured["total"] == measured["params"] + measured["grads"] + measured["optimizer"], (
        f"{where}: state_bytes['total'] must be the sum of the three maxima, got {measured}")
    predicted = theory.comm_breakdown(expected, psi_padded, world_size, bytes_per_element=4, kind="payload")
    for op in OPS:
        got = first["comm"].get(op, {}).get("payload_bytes", 0)
        assert got == predicted[op], (
            f"{where}: the first step's {op} payload was {got} bytes, helpers.theory predicts {predicted[op]:.0f} "
            f"for {expected} (padded Ψ = {psi_padded}). Record the ledger around forward and backward of step 1")
    reference = results[0][1]
    for rank, (result, _) in enumerate(results):
        params = result["params"]
        assert len(params) == len(reference) and all(p.shape == q.shape for p, q in zip(params, reference)), (
            f"{where}: rank {rank} returned parameters of shapes {[tuple(p.shape) for p in params]}; return the FULL "
            "parameters (DTensor.full_tensor()), in model.parameters() order")
        assert all(torch.equal(p, q) for p, q in zip(params, results[0][0]["params"])), (
            f"{where}: rank {rank}'s parameters differ from rank 0's: every rank must end with the same model")
        error = max((p - q).abs().max().item() for p, q in zip(params, reference))
        assert error <= TOL, (
            f"{where}: after {STEPS} Adam steps, max |parameters - torch DDP's| = {error:.2e} (tolerance {TOL:.0e}): "
            "the gradients were not averaged like DDP's, or the step order differs (forward, backward, step, zero_grad)")


@public_check("9.3")
def fsdp_within_budget_on_3_ranks(ns):
    train = answer(ns, "train_within_budget")
    # fp32 Adam on 3 ranks: ZeRO-2 needs 4 + 12 / 3 = 8 Ψ, FSDP 16 / 3 Ψ (+ padding). With the 2 + 2 + 12 convention
    # ZeRO-2 would need 6.7 Ψ and fit: this budget also tells whether the fp32 bytes were used.
    budget = int(7.5 * num_params(make_net()))
    _check_training(run_on_ranks(_on_ranks_train, 3, (train, budget), "train_within_budget"), 3, budget)


@public_check("9.3")
def zero2_within_budget_on_2_ranks(ns):
    train = answer(ns, "train_within_budget")
    budget = 12 * num_params(make_net())  # DDP needs 16 Ψ, ZeRO-2 on 2 ranks 4 Ψ + 12 Ψ / 2 = 10 Ψ
    _check_training(run_on_ranks(_on_ranks_train, 2, (train, budget), "train_within_budget"), 2, budget)
