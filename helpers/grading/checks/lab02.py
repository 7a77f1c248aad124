"""Public checks of lab 02: ring all-reduce built from point-to-point messages.

Every multi-rank check runs the student's functions through `helpers.launch` with a short
hang_timeout, so a deadlock becomes a failure with the launcher's report instead of a stuck notebook.
Rank-side helpers (names starting with `_on_ranks`) return plain data; the comparisons and the
messages are made here, in the kernel.
"""
import torch
import torch.distributed as dist
import torch.nn.functional as F

from helpers.comm import CommLedger
from helpers.errors import CollectiveHang
from helpers.grading.registry import answer, public_check
from helpers.launch import launch

HANG_TIMEOUT_S = 3.0
WORLD_SIZES = (1, 2, 3, 4)
# Lengths below the world size (empty chunks), not divisible by 3 or 4, and a 2-D shape.
SHAPES = ((1,), (2,), (5,), (10,), (1001,), (3, 5))
DTYPES = ("float32", "int64")
# float32 sums taken in another order differ in the last bits; integer sums must be exact.
RTOL, ATOL = 1e-5, 1e-5  # inputs are of size ~1: reordered float32 sums differ by ~1e-7
# Wire-byte checks: 30001 float32 elements, so uneven chunks round by at most 4 bytes in 40000.
BYTES_NUMEL = 30_001
BYTES_WORLD_SIZES = (3, 4)  # at N = 2 an unchunked ring sends (N-1) S = 2(N-1)/N S: it needs N >= 3
BYTES_TOLERANCE = 0.01
P2P_OPS = {"send", "recv"}
TRAIN_WORLD_SIZES = (2, 3)
TRAIN_STEPS, TRAIN_LR, TRAIN_BATCH = 3, 0.1, 12  # 12 samples: equal shards on 1, 2, 3 or 4 ranks


# --- running on ranks ------------------------------------------------------------------------------

def _launch(fn, world_size, args, what):
    """launch(), with a hang turned into a failure that quotes the launcher's report."""
    try:
        return launch(fn, world_size, args=args, hang_timeout=HANG_TIMEOUT_S)
    except CollectiveHang as exc:
        raise AssertionError(
            f"{what} hung at world size {world_size} (no progress for {HANG_TIMEOUT_S:g} s): a deadlock. "
            f"Blocking send/recv that every rank issues in the same order wait for each other; post "
            f"dist.isend/dist.irecv and then wait() on both. The launcher's report:\n{exc}") from None


def _rank_data(shape, dtype, rank, seed=0):
    """A rank's input: different on every rank, reproducible on any rank (so each can compute the sum)."""
    generator = torch.Generator().manual_seed(1000 * seed + rank)
    if dtype == "int64":
        return torch.randint(-1000, 1000, shape, generator=generator)
    return torch.randn(shape, generator=generator)


def _sum_of_ranks(shape, dtype, world_size):
    """The element-wise sum over every rank's _rank_data, in rank order."""
    total = _rank_data(shape, dtype, 0)
    for rank in range(1, world_size):
        total = total + _rank_data(shape, dtype, rank)
    return total


def _traffic(ledger):
    """(sorted op names, bytes this rank sent) from a ledger."""
    totals = ledger.totals()
    return sorted(totals), totals.get("send", {}).get("wire_bytes", 0)


def _on_ranks_exchange(fn, shape):
    rank = dist.get_rank()
    t = _rank_data(shape, "float32", rank)
    with CommLedger() as ledger:
        out = fn(t)
    return out, _traffic(ledger)[0]


def _on_ranks_reduce_scatter(fn, cases):
    rank, n = dist.get_rank(), dist.get_world_size()
    results = []
    for shape, dtype in cases:
        x = _rank_data(shape, dtype, rank)
        before = x.clone()
        with CommLedger() as ledger:
            out = fn(x)
        expected = torch.tensor_split(_sum_of_ranks(shape, dtype, n).reshape(-1), n)[rank]
        results.append((shape, dtype, out, expected, torch.equal(x, before), *_traffic(ledger)))
    return results


def _global_vector(numel, dtype):
    """The vector every rank holds a chunk of in the all-gather checks: 0.5, 1.5, 2.5, ... (exact)."""
    if dtype == "int64":
        return torch.arange(numel) * 3 - 7
    return torch.arange(numel, dtype=torch.float32) + 0.5


def _on_ranks_all_gather(fn, cases):
    rank, n = dist.get_rank(), dist.get_world_size()
    results = []
    for numel, dtype in cases:
        chunk = torch.tensor_split(_global_vector(numel, dtype), n)[rank].clone()
        with CommLedger() as ledger:
            out = fn(chunk, numel)
        results.append((numel, dtype, out, *_traffic(ledger)))
    return results


def _on_ranks_all_reduce(fn, cases):
    rank = dist.get_rank()
    results = []
    for shape, dtype in cases:
        x = _rank_data(shape, dtype, rank)
        reference = x.clone()
        dist.all_reduce(reference)  # outside the ledger: only the student's traffic is counted
        with CommLedger() as ledger:
            out = fn(x)
        results.append((shape, dtype, x, out is x, reference, *_traffic(ledger)))
    return results


# --- comparing -------------------------------------------------------------------------------------

def _where(rank, shape, dtype, world_size):
    return f"world size {world_size}, rank {rank}, input shape {tuple(shape)}, {dtype}"


def _assert_same_values(got, expected, where, what):
    """got == expected: exactly for integers, within RTOL/ATOL for floats; a message says how far off."""
    assert isinstance(got, torch.Tensor), f"{where}: {what} should be a tensor, got {type(got).__name__}"
    assert got.shape == expected.shape, (
        f"{where}: {what} should have shape {tuple(expected.shape)}, got {tuple(got.shape)}")
    if expected.dtype.is_floating_point:
        close = torch.allclose(got.to(expected.dtype), expected, rtol=RTOL, atol=ATOL)
    else:
        close = torch.equal(got, expected)
    if not close:
        worst = (got.double() - expected.double()).abs().max().item()
        raise AssertionError(f"{where}: {what} is wrong, off by up to {worst:.3g} "
                             f"(allowed: exact for integers, rtol={RTOL:g} atol={ATOL:g} for float32)")


def _assert_point_to_point(ops, where, name):
    others = sorted(set(ops) - P2P_OPS)
    assert not others, (f"{where}: {name} called {', '.join(others)}; build it from point-to-point "
                        "messages only (dist.isend / dist.irecv, or send / recv)")


def _assert_wire_bytes(sent, numel, element_size, factor, label):
    """Per rank within 1% of factor * S, and exactly (N * factor) S summed over ranks (no padding)."""
    n = len(sent)
    size = numel * element_size
    for rank, got in enumerate(sent):
        expected = factor * size
        if abs(got - expected) > BYTES_TOLERANCE * expected:
            if got == 0:
                hint = "no point-to-point send was recorded: build it from dist.isend / dist.irecv"
            elif got >= 0.9 * (n - 1) * size:
                hint = ("(N-1) S per rank is the whole tensor passed round the ring, or a root that sends "
                        "it to everyone: send one chunk of about S/N per step instead")
            else:
                hint = "each of the N-1 steps per phase sends one chunk (about S/N) to the right neighbour"
            raise AssertionError(
                f"world size {n}, S = {size:,} bytes: rank {rank} sent {got:,} bytes = {got / size:.3f} S, "
                f"a ring {label} sends {_formula(label)} = {factor:.3f} S = {expected:,.0f} bytes per "
                f"rank (1% allowed). {hint}")
    assert sum(sent) == round(n * factor * size), (
        f"world size {n}: the ranks sent {sum(sent):,} bytes in total; a ring {label} on torch.tensor_split "
        f"chunks sends exactly {round(n * factor * size):,} (= {n * factor:g} S): padding, or a chunk "
        f"sent twice, adds bytes")


def _formula(label):
    return "2(N-1)/N S" if label == "all-reduce" else "(N-1)/N S"


# --- 2.1 exchange_with_neighbours ------------------------------------------------------------------

@public_check("2.1")
def exchanges_with_both_neighbours(ns):
    fn = answer(ns, "exchange_with_neighbours")
    shape = (6,)
    for n in WORLD_SIZES:
        results = _launch(_on_ranks_exchange, n, (fn, shape), "exchange_with_neighbours")
        for rank, (out, ops) in enumerate(results):
            where = f"world size {n}, rank {rank}"
            assert isinstance(out, tuple) and len(out) == 2, (
                f"{where}: return a pair (from_left, from_right), got {type(out).__name__}")
            left, right = (rank - 1) % n, (rank + 1) % n
            _assert_same_values(out[0], _rank_data(shape, "float32", left), where,
                                f"from_left (rank {left}'s tensor)")
            _assert_same_values(out[1], _rank_data(shape, "float32", right), where,
                                f"from_right (rank {right}'s tensor)")
            _assert_point_to_point(ops, where, "exchange_with_neighbours")


# --- 2.2 ring_reduce_scatter -----------------------------------------------------------------------

@public_check("2.2")
def reduce_scatter_matches_tensor_split_of_sum(ns):
    fn = answer(ns, "ring_reduce_scatter")
    cases = [(shape, dtype) for shape in SHAPES for dtype in DTYPES]
    for n in WORLD_SIZES:
        for rank, result in enumerate(_launch(_on_ranks_reduce_scatter, n, (fn, cases), "ring_reduce_scatter")):
            for shape, dtype, out, expected, unchanged, ops, _ in result:
                where = _where(rank, shape, dtype, n)
                _assert_same_values(out, expected, where,
                                    f"the result (chunk {rank} of torch.tensor_split(sum.flatten(), {n}))")
                assert unchanged, f"{where}: ring_reduce_scatter must not modify its input; work on a copy"
                _assert_point_to_point(ops, where, "ring_reduce_scatter")


@public_check("2.2")
def reduce_scatter_sends_n_minus_1_over_n(ns):
    fn = answer(ns, "ring_reduce_scatter")
    for n in BYTES_WORLD_SIZES:
        results = _launch(_on_ranks_reduce_scatter, n, (fn, [((BYTES_NUMEL,), "float32")]), "ring_reduce_scatter")
        sent = [result[0][-1] for result in results]
        _assert_wire_bytes(sent, BYTES_NUMEL, 4, (n - 1) / n, "reduce-scatter")


# --- 2.3 ring_all_gather ---------------------------------------------------------------------------

@public_check("2.3")
def all_gather_rebuilds_the_vector(ns):
    fn = answer(ns, "ring_all_gather")
    cases = [(numel, dtype) for numel in (1, 2, 5, 10, 1001) for dtype in DTYPES]
    for n in WORLD_SIZES:
        for rank, result in enumerate(_launch(_on_ranks_all_gather, n, (fn, cases), "ring_all_gather")):
            for numel, dtype, out, ops, _ in result:
                where = f"world size {n}, rank {rank}, numel {numel}, {dtype}"
                _assert_same_values(out, _global_vector(numel, dtype), where,
                                    "the gathered vector (every rank's chunk, in rank order)")
                _assert_point_to_point(ops, where, "ring_all_gather")


@public_check("2.3")
def all_gather_sends_n_minus_1_over_n(ns):
    fn = answer(ns, "ring_all_gather")
    for n in BYTES_WORLD_SIZES:
        results = _launch(_on_ranks_all_gather, n, (fn, [(BYTES_NUMEL, "float32")]), "ring_all_gather")
        sent = [result[0][-1] for result in results]
        _assert_wire_bytes(sent, BYTES_NUMEL, 4, (n - 1) / n, "all-gather")


# --- 2.4 ring_all_reduce ---------------------------------------------------------------------------

@public_check("2.4")
def all_reduce_matches_dist_all_reduce(ns):
    fn = answer(ns, "ring_all_reduce")
    cases = [(shape, dtype) for shape in SHAPES for dtype in DTYPES]
    for n in WORLD_SIZES:
        for rank, result in enumerate(_launch(_on_ranks_all_reduce, n, (fn, cases), "ring_all_reduce")):
            for shape, dtype, x, returned_x, reference, ops, _ in result:
                where = _where(rank, shape, dtype, n)
                _assert_same_values(x, reference, where,
                                    "the tensor after the call (it must hold dist.all_reduce's sum, in place)")
                assert returned_x, f"{where}: return the tensor you were given (summed in place), like x = f(x)"
                _assert_point_to_point(ops, where, "ring_all_reduce")


@public_check("2.4")
def all_reduce_sends_2_n_minus_1_over_n(ns):
    fn = answer(ns, "ring_all_reduce")
    for n in BYTES_WORLD_SIZES:
        results = _launch(_on_ranks_all_reduce, n, (fn, [((BYTES_NUMEL,), "float32")]), "ring_all_reduce")
        sent = [result[0][-1] for result in results]
        _assert_wire_bytes(sent, BYTES_NUMEL, 4, 2 * (n - 1) / n, "all-reduce")


# --- 2.5 average_gradients: different data on every rank, identical parameters at the end ----------

def _tiny_model():
    torch.manual_seed(0)  # the same initial weights on every rank and in the single-process reference
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))


def _global_batch():
    generator = torch.Generator().manual_seed(1)
    return torch.randn(TRAIN_BATCH, 4, generator=generator), torch.randn(TRAIN_BATCH, 2, generator=generator)


def _train(average_gradients, rank, world_size):
    """TRAIN_STEPS of SGD on this rank's shard; returns (state_dict, sends per averaging call)."""
    model = _tiny_model()
    x, y = (t.tensor_split(world_size)[rank] for t in _global_batch())
    sends = []
    for _ in range(TRAIN_STEPS):
        model.zero_grad()
        F.mse_loss(model(x), y).backward()  # the mean over this rank's shard
        if average_gradients is not None:
            with CommLedger() as ledger:
                average_gradients(model)
            sends.append(ledger.totals().get("send", {}).get("calls", 0))
        with torch.no_grad():  # plain SGD by hand: torch.optim's first use imports torch._dynamo (~1.5 s)
            for p in model.parameters():
                p -= TRAIN_LR * p.grad
    return {k: v.detach().clone() for k, v in model.state_dict().items()}, sends


def _on_ranks_train(average_gradients, ring_all_reduce):
    with CommLedger() as ledger:
        ring_all_reduce(torch.ones(10))
    one_call = ledger.totals().get("send", {}).get("calls", 0)
    state, sends = _train(average_gradients, dist.get_rank(), dist.get_world_size())
    return state, sends, one_call


@public_check("2.5")
def ranks_end_identical_and_equal_to_one_process(ns):
    fn = answer(ns, "average_gradients")
    ring = answer(ns, "ring_all_reduce")
    reference, _ = _train(None, 0, 1)  # one process, the full batch of TRAIN_BATCH samples
    for n in TRAIN_WORLD_SIZES:
        results = _launch(_on_ranks_train, n, (fn, ring), "average_gradients")
        states = [state for state, _, _ in results]
        for rank, state in enumerate(states):  # first: do the replicas agree with each other?
            for name, value in state.items():
                assert torch.equal(value, states[0][name]), (
                    f"world size {n}, rank {rank}, after {TRAIN_STEPS} SGD steps: parameter {name} differs "
                    f"from rank 0's by {(value - states[0][name]).abs().max().item():.3g}: the ranks did not "
                    "apply the same gradient. Average p.grad (not the parameters) with ring_all_reduce")
        for rank, (state, sends, one_call) in enumerate(results):  # then: with single-process training?
            where = f"world size {n}, rank {rank}, after {TRAIN_STEPS} SGD steps"
            for name, value in state.items():
                assert torch.allclose(value, reference[name], rtol=RTOL, atol=ATOL), (
                    f"{where}: parameter {name} differs from one process trained on the full batch by "
                    f"{(value - reference[name]).abs().max().item():.3g} (rtol={RTOL:g}, atol={ATOL:g}): "
                    "is the sum divided by the world size (the mean of the shard gradients)?")
            assert all(s == one_call for s in sends), (
                f"{where}: average_gradients issued {sends} sends per step, one ring_all_reduce issues "
                f"{one_call}: pack every gradient into one flat tensor and call ring_all_reduce once")
