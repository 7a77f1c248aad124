"""Public checks of lab 07 (ZeRO-1 and ZeRO-2): shard arithmetic, the sharded AdamW step, the gradient
reduce-scatter, and the training loop proved against torch DDP + AdamW.

Multi-rank checks run the student's functions on 3 ranks (an odd world size: every flat parameter here needs
padding) through helpers.launch; the functions travel by value. One launch serves all the checks of a question:
its result is kept, keyed by the student's function objects, until they are redefined.
"""
import math

import torch
import torch.distributed as dist
import torch.nn as nn

from helpers.comm import CommLedger
from helpers.grading.registry import answer, public_check
from helpers.grading.shared_run import SharedRun, launch_on_gloo
from helpers.memory import state_bytes

WORLD_SIZE = 3
HANG_S = 20.0  # a check whose ranks wait longer than this reports CollectiveHang instead of hanging
# float32 parameters of size < 1 after a few AdamW steps: the same sums in another order (or Adam's formula written
# with other operations) differ by a few roundings of 2**-24 (about 6e-8); 1e-6 allows that and is far below any
# real bug (chapter 07, section 6 measures it, and the float64 run there shrinks it to 1e-16).
TOL = 1e-6

_memoized = SharedRun()  # one launch serves every check of a question


def _launch(fn, *args, hint=""):
    """Run fn on WORLD_SIZE Gloo ranks; a hang or a dead rank becomes a failure that says what to look at."""
    return launch_on_gloo(fn, WORLD_SIZE, args, HANG_S, hint)


def _flat(tensors):
    return torch.cat([t.detach().reshape(-1) for t in tensors])


def _max_diff(a, b):
    return (a.double() - b.double()).abs().max().item()


def _ref_shard_range(numel, rank, world_size):
    size = math.ceil(numel / world_size)
    start = min(rank * size, numel)
    stop = min(start + size, numel)
    return start, stop, size - (stop - start)


def _padded_shard(flat, rank, world_size):
    """Rank's shard of `flat` padded with zeros to a multiple of world_size (the reference layout)."""
    size = math.ceil(flat.numel() / world_size)
    padded = torch.cat([flat, flat.new_zeros(size * world_size - flat.numel())])
    return padded.view(world_size, size)[rank]


def _ops(records):
    """[(op, payload bytes)] of a ledger's records, in order."""
    return [(r.op, r.payload_bytes) for r in records]


# --- 7.1 shard_range ----------------------------------------------------------------------------

def _compare(shard_range, cases, why=""):
    for numel, world_size in cases:
        for rank in range(world_size):
            call = f"shard_range({numel}, rank={rank}, world_size={world_size})"
            got = shard_range(numel, rank, world_size)
            assert got is not None, f"{call} returned None: return (start, stop, pad)"
            got = tuple(int(v) for v in got)
            expected = _ref_shard_range(numel, rank, world_size)
            assert got == expected, (f"{call} returned {got}; expected {expected}: every shard has "
                                     f"ceil({numel} / {world_size}) = {math.ceil(numel / world_size)} elements of "
                                     f"the padded flat parameter{why}")


@public_check("7.1")
def even_split(ns):
    _compare(answer(ns, "shard_range"), [(12, 1), (12, 2), (12, 3), (12, 4), (385, 5)])


@public_check("7.1")
def padding_goes_to_the_last_ranks(ns):
    _compare(answer(ns, "shard_range"), [(10, 3), (10, 4), (385, 2), (385, 3), (385, 4), (7, 6)],
             why=", and the padding zeros sit at the end of the flat parameter")


@public_check("7.1")
def ranks_with_only_padding(ns):
    """5 elements on 4 ranks: shards of 2, so rank 3 starts at element 6 > 5 and holds only padding."""
    _compare(answer(ns, "shard_range"), [(5, 4), (1, 3), (2, 8), (9, 7)],
             why="; a shard that starts past the last real element holds none (start == stop == numel)")


@public_check("7.1")
def shards_tile_the_flat_parameter(ns):
    shard_range = answer(ns, "shard_range")
    for numel in range(1, 40):
        for world_size in range(1, 9):
            ranges = [tuple(int(v) for v in shard_range(numel, rank, world_size)) for rank in range(world_size)]
            size = math.ceil(numel / world_size)
            assert all(stop - start + pad == size for start, stop, pad in ranges), (
                f"numel={numel}, world_size={world_size}: every shard must have {size} elements "
                f"(stop - start + pad); got {ranges}")
            covered = [i for start, stop, _ in ranges for i in range(start, stop)]
            assert covered == list(range(numel)), (
                f"numel={numel}, world_size={world_size}: the ranges {ranges} must cover 0 .. {numel - 1} once, "
                "in rank order")


@public_check("7.1")
def rejects_a_bad_rank(ns):
    shard_range = answer(ns, "shard_range")
    for rank in (3, -1):
        try:
            shard_range(10, rank, 3)
        except ValueError:
            continue
        raise AssertionError(f"shard_range(10, rank={rank}, world_size=3) should raise ValueError "
                             "(rank must be in 0 .. world_size - 1)")


# --- 7.2 zero_adamw_step ------------------------------------------------------------------------

STEPS_7_2 = 3
# name -> (parameter shapes, lr, weight_decay). "model": 34 elements, shards of 12, 2 padding zeros on rank 2.
# "tiny": 4 elements, shards of 2: rank 2 holds only padding. weight_decay=0 is torch.optim.Adam.
CASES_7_2 = {"model": ([(4, 5), (4,), (2, 4), (2,)], 0.05, 0.1), "tiny": ([(3,), (1,)], 0.1, 0.0)}


def _params_7_2(shapes):
    generator = torch.Generator().manual_seed(7)
    return [nn.Parameter(0.5 * torch.randn(shape, generator=generator)) for shape in shapes]


def _mean_gradient_7_2(numel, step):
    """The mean gradient of step `step`: the same on every rank (as after averaging)."""
    return torch.randn(numel, generator=torch.Generator().manual_seed(100 + step))


def _step_on_rank(step_fn):
    """Runs on every rank: the student's step, STEPS_7_2 times per case, on this rank's shard of known gradients."""
    rank, world_size = dist.get_rank(), dist.get_world_size()
    out = {}
    for case, (shapes, lr, weight_decay) in CASES_7_2.items():
        params = _params_7_2(shapes)
        numel = sum(p.numel() for p in params)
        size = math.ceil(numel / world_size)
        state = {"step": 0, "exp_avg": torch.zeros(size), "exp_avg_sq": torch.zeros(size)}
        objects = [id(p) for p in params]
        history, records = [], []
        for step in range(STEPS_7_2):
            grad_shard = _padded_shard(_mean_gradient_7_2(numel, step), rank, world_size).clone()
            with CommLedger() as ledger:
                step_fn(params, grad_shard, state, lr=lr, weight_decay=weight_decay)
            history.append(_flat(params).clone())
            records.append(_ops(ledger.records))
        in_place = [id(p) for p in params] == objects and all(p.is_leaf and p.requires_grad for p in params)
        out[case] = {"history": history, "records": records, "in_place": in_place, "step": state.get("step"),
                     "exp_avg": state.get("exp_avg"), "exp_avg_sq": state.get("exp_avg_sq")}
    return out


def _reference_7_2(case):
    """One process, torch.optim.AdamW on the whole parameters: parameters after each step, final state (flat)."""
    shapes, lr, weight_decay = CASES_7_2[case]
    params = _params_7_2(shapes)
    optimizer = torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay)
    numel, history = sum(p.numel() for p in params), []
    for step in range(STEPS_7_2):
        offset, grad = 0, _mean_gradient_7_2(numel, step)
        for p in params:
            p.grad = grad[offset : offset + p.numel()].view_as(p).clone()
            offset += p.numel()
        optimizer.step()
        history.append(_flat(params).clone())
    state = {key: _flat([optimizer.state[p][key] for p in params]) for key in ("exp_avg", "exp_avg_sq")}
    return history, state


def _step_results(ns):
    fn = answer(ns, "zero_adamw_step")
    hint = "Every rank must call exactly one dist.all_gather_single per step, with equal-sized shards. "
    return _memoized("7.2", fn, lambda: _launch(_step_on_rank, fn, hint=hint))


@public_check("7.2")
def parameters_equal_torch_adamw(ns):
    results = _step_results(ns)
    for case, (shapes, lr, weight_decay) in CASES_7_2.items():
        expected, _ = _reference_7_2(case)
        for step in range(STEPS_7_2):
            diff = _max_diff(results[0][case]["history"][step], expected[step])
            assert diff < TOL, (
                f"{sum(math.prod(s) for s in shapes)} parameters, lr={lr}, weight_decay={weight_decay}: after step "
                f"{step + 1} rank 0's parameters differ from torch.optim.AdamW's by {diff:.3g} (tolerance {TOL:g}). "
                "Check: the state's step counts from 1 (bias corrections 1 - beta**step); weight decay is decoupled "
                "(p *= 1 - lr * weight_decay, before the Adam update, not added to the gradient); the updated "
                "shard of every rank lands at offset rank * shard size of the gathered flat parameter")


@public_check("7.2")
def identical_on_every_rank(ns):
    results = _step_results(ns)
    for case in CASES_7_2:
        for rank in range(1, WORLD_SIZE):
            diff = _max_diff(results[rank][case]["history"][-1], results[0][case]["history"][-1])
            assert diff == 0, (f"case {case!r}: rank {rank}'s parameters differ from rank 0's by {diff:.3g}; after "
                               "the all-gather every rank must copy the same gathered flat parameter into its tensors")


@public_check("7.2")
def state_is_this_rank_shard_only(ns):
    results = _step_results(ns)
    for case, (shapes, _, _) in CASES_7_2.items():
        _, expected = _reference_7_2(case)
        numel = sum(math.prod(s) for s in shapes)
        size = math.ceil(numel / WORLD_SIZE)
        for rank, result in enumerate(results):
            got = result[case]
            assert got["step"] == STEPS_7_2, (f"case {case!r}, rank {rank}: state['step'] is {got['step']!r} after "
                                              f"{STEPS_7_2} calls; increment it once per call (it starts at 0)")
            for key in ("exp_avg", "exp_avg_sq"):
                tensor = got[key]
                assert isinstance(tensor, torch.Tensor) and tensor.shape == (size,) and tensor.dtype == torch.float32, (
                    f"case {case!r}, rank {rank}: state[{key!r}] should be a float32 tensor of {size} elements "
                    f"(this rank's shard of {numel} padded to a multiple of {WORLD_SIZE}); got "
                    f"{getattr(tensor, 'dtype', type(tensor).__name__)} {tuple(getattr(tensor, 'shape', ()))}")
                reference = _padded_shard(expected[key], rank, WORLD_SIZE)
                diff = _max_diff(tensor, reference)
                assert diff < TOL, (
                    f"case {case!r}, rank {rank}: state[{key!r}] differs from torch.optim.AdamW's {key} for this "
                    f"rank's shard by {diff:.3g}. Keep Adam's moments in state (updated in place every call); "
                    "an optimizer created inside the function starts from zeros every call")


@public_check("7.2")
def one_all_gather_per_step(ns):
    results = _step_results(ns)
    for case, (shapes, _, _) in CASES_7_2.items():
        padded = math.ceil(sum(math.prod(s) for s in shapes) / WORLD_SIZE) * WORLD_SIZE
        expected = [("all_gather", 4 * padded)]
        for rank, result in enumerate(results):
            for step, ops in enumerate(result[case]["records"]):
                assert ops == expected, (
                    f"case {case!r}, rank {rank}, step {step + 1}: the ledger shows {ops}; expected exactly one "
                    f"all_gather of the padded flat parameter ({padded} float32 = {4 * padded} bytes): each rank "
                    "updates its own shard and dist.all_gather_single collects them. (An all_reduce or a broadcast "
                    "per rank sends more; parameters are not averaged in ZeRO)")


@public_check("7.2")
def parameters_updated_in_place(ns):
    for rank, result in enumerate(_step_results(ns)):
        for case in CASES_7_2:
            assert result[case]["in_place"], (
                f"case {case!r}, rank {rank}: the parameters must stay the same tensor objects, trainable leaves "
                "(an optimizer or a model holding them must see the update): copy the gathered values into them "
                "under torch.no_grad() (p.copy_(...)); do not replace them in the list")


# --- 7.3 reduce_scatter_gradients ---------------------------------------------------------------

def _model_7_3():
    torch.manual_seed(3)
    return nn.Sequential(nn.Linear(5, 4), nn.Tanh(), nn.Linear(4, 2))  # 34 parameters: shards of 12, 2 padding


def _reduce_on_rank(fn):
    """Runs on every rank: the same model, different data; on rank 1 one gradient is missing; the student's call."""
    rank = dist.get_rank()
    model = _model_7_3()
    x = torch.randn(3 + rank, 5, generator=torch.Generator().manual_seed(30 + rank))
    model(x).square().mean().backward()
    if rank == 1:
        model[2].bias.grad = None  # as if rank 1's forward had not used it
    params = list(model.parameters())
    local = [torch.zeros_like(p) if p.grad is None else p.grad.clone() for p in params]
    before = _flat(params).clone()
    with CommLedger() as ledger:
        shard = fn(params)
    is_tensor = isinstance(shard, torch.Tensor)
    held = state_bytes(model, extra={"grads": [shard]} if is_tensor else None)
    return {"local": _flat(local), "shard": shard.detach().clone() if is_tensor else shard,
            "grads_left": [n for (n, p) in model.named_parameters() if p.grad is not None],
            "records": _ops(ledger.records), "held": held, "params_moved": not torch.equal(before, _flat(params))}


def _reduce_results(ns):
    fn = answer(ns, "reduce_scatter_gradients")
    hint = ("Every rank must pass an input of the same size (world_size x shard size, zeros for a missing "
            "gradient) to one dist.reduce_scatter_single. ")
    return _memoized("7.3", fn, lambda: _launch(_reduce_on_rank, fn, hint=hint))


def _mean_local(results):
    return sum(r["local"] for r in results) / WORLD_SIZE


@public_check("7.3")
def shard_of_the_mean_gradient(ns):
    results = _reduce_results(ns)
    mean = _mean_local(results)
    size = math.ceil(mean.numel() / WORLD_SIZE)
    for rank, result in enumerate(results):
        shard = result["shard"]
        assert isinstance(shard, torch.Tensor) and shard.shape == (size,), (
            f"rank {rank} returned {type(shard).__name__} {tuple(getattr(shard, 'shape', ()))}; expected a 1-D "
            f"tensor of {size} elements (its shard of the {mean.numel()} gradient elements padded to "
            f"{size * WORLD_SIZE})")
        expected = _padded_shard(mean, rank, WORLD_SIZE)
        if _max_diff(shard, WORLD_SIZE * expected) < TOL < _max_diff(shard, expected):
            raise AssertionError(f"rank {rank}'s shard is the SUM over the {WORLD_SIZE} ranks: divide by the world "
                                 "size. (Adam would almost hide this bug: its update barely changes when the "
                                 "gradient is scaled, so test the gradient itself)")
        diff = _max_diff(shard, expected)
        assert diff < TOL, (f"rank {rank}'s shard differs from its shard of the mean gradient (elements "
                            f"{rank * size} .. {(rank + 1) * size - 1} of the padded flat gradient) by {diff:.3g}")


@public_check("7.3")
def missing_gradient_counts_as_zeros(ns):
    """Rank 1's last bias has no gradient: it must still take its place in the flat gradient, as zeros."""
    results = _reduce_results(ns)
    mean = _mean_local(results)
    last = _padded_shard(mean, WORLD_SIZE - 1, WORLD_SIZE)  # the last 2 real elements (2.bias) are in rank 2's shard
    diff = _max_diff(results[-1]["shard"], last)
    assert diff < TOL, (f"rank 2's shard (which holds the last bias) is wrong by {diff:.3g}: on rank 1 that bias's "
                        ".grad is None; it must count as zeros, at its own place in the flat gradient")


@public_check("7.3")
def full_gradients_are_freed(ns):
    for rank, result in enumerate(_reduce_results(ns)):
        assert not result["grads_left"], (f"rank {rank}: {result['grads_left']} still have a .grad; ZeRO-2 keeps only "
                                          "the gradient shard: set every p.grad = None after the reduce-scatter")
        assert not result["params_moved"], f"rank {rank}: the parameters changed; only the gradients may be touched"


@public_check("7.3")
def one_reduce_scatter(ns):
    results = _reduce_results(ns)
    padded = math.ceil(results[0]["local"].numel() / WORLD_SIZE) * WORLD_SIZE
    for rank, result in enumerate(results):
        assert result["records"] == [("reduce_scatter", 4 * padded)], (
            f"rank {rank}: the ledger shows {result['records']}; expected exactly one reduce_scatter of the padded "
            f"flat gradient ({padded} float32 = {4 * padded} bytes of input). An all_reduce sums the other ranks' "
            "shards for nothing")


@public_check("7.3")
def gradient_bytes_are_one_nth(ns):
    results = _reduce_results(ns)
    numel = results[0]["local"].numel()
    size = math.ceil(numel / WORLD_SIZE)
    for rank, result in enumerate(results):
        grads = result["held"]["grads"]
        assert grads == 4 * size, (f"rank {rank} holds {grads} bytes of gradients after the call (state_bytes: "
                                   f".grad of the parameters + the returned shard); expected only the shard: "
                                   f"4 x {size} = {4 * size} bytes, vs {4 * numel} for DDP's full gradient")


# --- 7.4 train_zero2 ----------------------------------------------------------------------------

STEPS_7_4, LR_7_4, WD_7_4 = 4, 0.02, 0.01


def _model_7_4():
    """A frozen first layer (48 parameters), then 41 trainable ones: shards of 14 on 3 ranks, 1 padding zero."""
    torch.manual_seed(4)
    model = nn.Sequential(nn.Linear(5, 8), nn.Tanh(), nn.Linear(8, 4), nn.Tanh(), nn.Linear(4, 1))
    model[0].requires_grad_(False)
    return model


TRAINABLE_7_4 = 8 * 4 + 4 + 4 + 1


def _batches_7_4(rank):
    """This rank's own batches: different data on every rank."""
    generator = torch.Generator().manual_seed(40 + rank)
    out = []
    for _ in range(STEPS_7_4):
        x = torch.randn(3, 5, generator=generator)
        out.append((x, torch.sin(x.sum(dim=1, keepdim=True))))
    return out


def _train_on_rank(train):
    """Runs on every rank: the student's ZeRO-2 training, then torch DDP + AdamW on the same batches."""
    from torch.nn.parallel import DistributedDataParallel

    batches = _batches_7_4(dist.get_rank())
    model = _model_7_4()
    with CommLedger() as ledger:
        state = train(model, batches, lr=LR_7_4, weight_decay=WD_7_4)
    held = None
    if isinstance(state, dict) and all(isinstance(state.get(k), torch.Tensor) for k in ("exp_avg", "exp_avg_sq")):
        held = state_bytes(model, extra={"optimizer": [state["exp_avg"], state["exp_avg_sq"]]})
    frozen_grads = [p.grad is not None for p in model[0].parameters()]
    zero = {"params": _flat(model.parameters()), "records": [(r.op, r.wire_bytes) for r in ledger.records],
            "held": held, "frozen_grads": any(frozen_grads)}

    reference = DistributedDataParallel(_model_7_4())
    optimizer = torch.optim.AdamW([p for p in reference.parameters() if p.requires_grad], lr=LR_7_4,
                                  weight_decay=WD_7_4)
    with CommLedger() as ddp_ledger:
        for x, y in batches:
            optimizer.zero_grad()
            nn.functional.mse_loss(reference(x), y).backward()
            optimizer.step()
    ddp = {"params": _flat(reference.module.parameters()),
           "all_reduce_wire": [r.wire_bytes for r in ddp_ledger.records if r.op == "all_reduce"],
           "held": state_bytes(reference.module, optimizer)}
    return zero, ddp


def _training_results(ns):
    names = ("train_zero2", "reduce_scatter_gradients", "zero_adamw_step", "adam_state", "shard_range")
    key = tuple(ns.get(name) for name in names)
    train = answer(ns, "train_zero2")
    hint = "Every rank must run the same number of steps, each with one reduce-scatter and one all-gather. "
    return _memoized("7.4", key, lambda: _launch(_train_on_rank, train, hint=hint))


@public_check("7.4")
def identical_on_every_rank_despite_different_data(ns):
    results = _training_results(ns)
    for rank in range(1, WORLD_SIZE):
        diff = _max_diff(results[rank][0]["params"], results[0][0]["params"])
        assert diff == 0, (f"after {STEPS_7_4} steps on different data, rank {rank}'s parameters differ from rank 0's "
                           f"by {diff:.3g}: every rank must update its shard with the MEAN gradient's shard "
                           "(reduce_scatter_gradients) and then copy the all-gathered parameters")


@public_check("7.4")
def equals_torch_ddp_adamw(ns):
    results = _training_results(ns)
    zero, ddp = results[0]
    diff = _max_diff(zero["params"], ddp["params"])
    assert diff < TOL, (f"after {STEPS_7_4} steps rank 0's parameters differ from torch DDP + AdamW's (same start, "
                        f"same batches) by {diff:.3g} (tolerance {TOL:g}); check: the mean MSE loss of the local "
                        "batch, one reduce_scatter_gradients and one zero_adamw_step per batch, the same state "
                        "across steps, lr and weight_decay passed on")


@public_check("7.4")
def frozen_parameters_untouched(ns):
    results = _training_results(ns)
    frozen = _flat(_model_7_4()[0].parameters())
    for rank, (zero, _) in enumerate(results):
        diff = _max_diff(zero["params"][: frozen.numel()], frozen)
        assert diff == 0 and not zero["frozen_grads"], (
            f"rank {rank}: the frozen first layer (requires_grad=False) changed by {diff:.3g} or got a .grad: keep "
            "only the parameters with requires_grad=True in the flat parameter (weight decay would shrink the "
            "frozen ones, and their state would waste memory)")


@public_check("7.4")
def wire_bytes_equal_ddp_padding_aside(ns):
    results = _training_results(ns)
    pad = -TRAINABLE_7_4 % WORLD_SIZE
    padding_share = 2 * (WORLD_SIZE - 1) / WORLD_SIZE * 4 * pad  # bytes a rank sends for the padding, per step
    for rank, (zero, ddp) in enumerate(results):
        ops = sorted({op for op, _ in zero["records"]})
        assert ops == ["all_gather", "reduce_scatter"], (
            f"rank {rank}: the ledger shows collectives {ops} during training; ZeRO-2 uses only reduce_scatter "
            "(gradients) and all_gather (parameters)")
        calls = [op for op, _ in zero["records"]]
        assert calls == ["reduce_scatter", "all_gather"] * STEPS_7_4, (
            f"rank {rank}: {calls.count('reduce_scatter')} reduce_scatter and {calls.count('all_gather')} all_gather "
            f"calls in {STEPS_7_4} steps; expected one of each per step, in that order")
        zero_wire = sum(w for _, w in zero["records"]) / STEPS_7_4
        ddp_wire = sum(ddp["all_reduce_wire"]) / len(ddp["all_reduce_wire"])
        # one byte per call of slack: the ledger rounds each call's wire bytes down to a whole byte
        assert abs(zero_wire - (ddp_wire + padding_share)) <= 2, (
            f"rank {rank}: {zero_wire:.0f} wire bytes per step; DDP's all-reduce sends {ddp_wire:.0f}, and the "
            f"reduce-scatter + all-gather of ZeRO should send that plus 2 (N-1)/N x 4 x {pad} padding element(s) "
            f"= {padding_share:.1f} bytes")


@public_check("7.4")
def optimizer_state_is_one_nth(ns):
    results = _training_results(ns)
    size = math.ceil(TRAINABLE_7_4 / WORLD_SIZE)
    for rank, (zero, ddp) in enumerate(results):
        assert zero["held"] is not None, (
            f"rank {rank}: train_zero2 should return its state dict (with 'exp_avg' and 'exp_avg_sq' tensors)")
        got, full = zero["held"]["optimizer"], ddp["held"]["optimizer"]
        assert got == 8 * size, (
            f"rank {rank} holds {got} bytes of optimizer state; expected exp_avg + exp_avg_sq of its shard only: "
            f"2 x 4 x {size} = {8 * size} bytes, about 1/{WORLD_SIZE} of DDP + AdamW's {full}")
