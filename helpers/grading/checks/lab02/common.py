"""Shared pieces of lab 02's checks: constants, rank data, the launcher, and the comparisons."""
import torch

from helpers.errors import CollectiveHang
from helpers.grading.shared_run import RunFailed
from helpers.grading.shared_run import launch_gloo as launch  # starts no ranks for a TODO

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
# Added to the seeds and values of the checks' data: 0 here. The grader's hidden tests run these checks with it set
# from their secret seed (helpers/grading/judge/replay.py), so they say what the check says of other data.
OFFSET = 0


# --- running on ranks ------------------------------------------------------------------------------

def _launch(fn, world_size, args, what):
    """launch() on Gloo ranks, like every lab's checks; a hang becomes a failure quoting the launcher's report."""
    try:
        return launch(fn, world_size, args=args, backend="gloo", hang_timeout=HANG_TIMEOUT_S)
    except CollectiveHang as exc:
        raise RunFailed(
            f"{what} hung at world size {world_size}: a deadlock. "
            f"Blocking send/recv that every rank issues in the same order wait for each other; post "
            f"dist.isend/dist.irecv and then wait() on both. Launcher's report:\n{exc}") from None


def _rank_data(shape, dtype, rank, seed=0):
    """A rank's input: different on every rank, reproducible on any rank (so each can compute the sum)."""
    generator = torch.Generator().manual_seed(1000 * (seed + 7 * OFFSET) + rank)
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
