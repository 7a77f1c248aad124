"""Lab 02's public checks: the solution passes them, realistic wrong answers fail with a useful message."""
import pytest

from helpers.grading import check
from helpers.grading.labgen import ROOT
from tests.lab_solution import assert_report_mentions as assert_fails
from tests.lab_solution import definitions

SOLUTION = ROOT / "solutions" / "02_collectives.ipynb"


def solution_namespace(extra_source=""):
    """The solution's definitions, with extra_source (a wrong answer) replacing one of them."""
    return definitions(SOLUTION, extra_source)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("question", ["2.1", "2.2", "2.3", "2.4", "2.5"])
def test_solution_passes(question):
    result = check(question, solution_namespace())
    assert result.total > 0 and result.passed == result.total, result.lines


BLOCKING_EXCHANGE = '''
def exchange_with_neighbours(t):
    rank, n = dist.get_rank(), dist.get_world_size()
    left, right = (rank - 1) % n, (rank + 1) % n
    from_left, from_right = torch.empty_like(t), torch.empty_like(t)
    if n == 1:
        return t.clone(), t.clone()
    dist.send(t, dst=right)
    dist.send(t, dst=left)
    dist.recv(from_left, src=left)
    dist.recv(from_right, src=right)
    return from_left, from_right
'''

SWAPPED_EXCHANGE = '''
_right = exchange_with_neighbours
def exchange_with_neighbours(t):
    from_left, from_right = _right(t)
    return from_right, from_left
'''


@pytest.mark.timeout(120)
def test_deadlocking_exchange_fails_with_the_hang_report():
    assert_fails("2.1", solution_namespace(BLOCKING_EXCHANGE),
                 "exchange_with_neighbours hung at world size 2", "rank 0: blocked in send #1")


@pytest.mark.timeout(120)
def test_swapped_neighbours_fail():
    assert_fails("2.1", solution_namespace(SWAPPED_EXCHANGE), "from_left (rank 2's tensor)", "world size 3")


WRONG_CHUNK_REDUCE_SCATTER = '''
def ring_reduce_scatter(tensor):
    # chapter 02's schedule unchanged: rank r ends with chunk r + 1
    rank, n = dist.get_rank(), dist.get_world_size()
    chunks = tensor.reshape(-1).clone().tensor_split(n)
    for step in range(n - 1):
        outgoing, arriving = chunks[(rank - step) % n], chunks[(rank - step - 1) % n]
        incoming = torch.empty_like(arriving)
        works = [dist.isend(outgoing, (rank + 1) % n), dist.irecv(incoming, (rank - 1) % n)]
        for work in works:
            work.wait()
        arriving += incoming
    return chunks[(rank + 1) % n]
'''

PADDED_REDUCE_SCATTER = '''
def ring_reduce_scatter(tensor):
    # pads to a multiple of N: right values, but padding goes on the wire
    rank, n = dist.get_rank(), dist.get_world_size()
    flat = tensor.reshape(-1)
    padded = torch.cat([flat, flat.new_zeros((-flat.numel()) % n)]).view(n, -1)
    for step in range(n - 1):
        outgoing, arriving = padded[(rank - step - 1) % n], padded[(rank - step - 2) % n]
        incoming = torch.empty_like(arriving)
        works = [dist.isend(outgoing, (rank + 1) % n), dist.irecv(incoming, (rank - 1) % n)]
        for work in works:
            work.wait()
        arriving += incoming
    return padded.view(-1)[:flat.numel()].tensor_split(n)[rank]
'''


@pytest.mark.timeout(120)
def test_reduce_scatter_keeping_the_wrong_chunk_fails():
    assert_fails("2.2", solution_namespace(WRONG_CHUNK_REDUCE_SCATTER), "world size 2, rank 0", "chunk 0 of")


@pytest.mark.timeout(120)
def test_padded_reduce_scatter_fails_the_exact_byte_count():
    assert_fails("2.2", solution_namespace(PADDED_REDUCE_SCATTER), "padding")


SHIFTED_ALL_GATHER = '''
def ring_all_gather(chunk, numel):
    # stores each arriving chunk one place too far round the ring
    rank, n = dist.get_rank(), dist.get_world_size()
    out = chunk.new_empty(numel)
    chunks = out.tensor_split(n)
    chunks[rank].copy_(chunk)
    for step in range(n - 1):
        incoming = torch.empty_like(chunks[(rank - step - 1) % n])
        works = [dist.isend(chunks[(rank - step) % n].clone(), (rank + 1) % n), dist.irecv(incoming, (rank - 1) % n)]
        for work in works:
            work.wait()
        target = chunks[(rank - step - 2) % n]
        if target.numel() == incoming.numel():
            target.copy_(incoming)
    return out
'''

GATHER_WITH_TORCH = '''
def ring_all_gather(chunk, numel):
    sizes = [c.numel() for c in torch.empty(numel).tensor_split(dist.get_world_size())]
    parts = [chunk.new_empty(size) for size in sizes]
    dist.all_gather(parts, chunk)
    return torch.cat(parts)
'''


@pytest.mark.timeout(120)
@pytest.mark.parametrize("source, fragments", [
    (SHIFTED_ALL_GATHER, ["the gathered vector (every rank's chunk, in rank order) is wrong"]),
    (GATHER_WITH_TORCH, ["called all_gather", "point-to-point"]),
], ids=["shifted", "dist.all_gather"])
def test_wrong_all_gather_fails(source, fragments):
    assert_fails("2.3", solution_namespace(source), *fragments)


UNCHUNKED_RING = '''
def ring_all_reduce(tensor):
    # the tutorial bug: the whole tensor goes round the ring, N - 1 times
    rank, n = dist.get_rank(), dist.get_world_size()
    message, total = tensor.clone(), tensor.clone()
    for _ in range(n - 1):
        incoming = torch.empty_like(message)
        works = [dist.isend(message, (rank + 1) % n), dist.irecv(incoming, (rank - 1) % n)]
        for work in works:
            work.wait()
        total += incoming
        message = incoming
    tensor.copy_(total)
    return tensor
'''

NAIVE_ALL_REDUCE = '''
def ring_all_reduce(tensor):
    # everyone sends to rank 0, which sums and sends the sum back
    rank, n = dist.get_rank(), dist.get_world_size()
    if rank == 0:
        for src in range(1, n):
            incoming = torch.empty_like(tensor)
            dist.recv(incoming, src)
            tensor += incoming
        for dst in range(1, n):
            dist.send(tensor, dst)
    elif n > 1:
        dist.send(tensor, 0)
        dist.recv(tensor, 0)
    return tensor
'''

TORCH_ALL_REDUCE = '''
def ring_all_reduce(tensor):
    dist.all_reduce(tensor)
    return tensor
'''

NOT_IN_PLACE = '''
def ring_all_reduce(tensor):
    return ring_all_gather(ring_reduce_scatter(tensor), tensor.numel()).view(tensor.shape)
'''


@pytest.mark.timeout(120)
@pytest.mark.parametrize("source, fragments", [
    (UNCHUNKED_RING, ["2.000 S", "whole tensor passed round the ring"]),
    (NAIVE_ALL_REDUCE, ["rank 0 sent", "2.000 S", "a root that sends it to everyone"]),
    (TORCH_ALL_REDUCE, ["called all_reduce", "point-to-point"]),
    (NOT_IN_PLACE, ["in place"]),
], ids=["unchunked", "naive", "dist.all_reduce", "not in place"])
def test_wrong_all_reduce_fails(source, fragments):
    assert_fails("2.4", solution_namespace(source), *fragments)


AVERAGE_PARAMETERS = '''
def average_gradients(model):
    # the picotron bug: averages the parameters, not the gradients
    flat = torch.cat([p.data.reshape(-1) for p in model.parameters()])
    ring_all_reduce(flat)
    flat /= dist.get_world_size()
    offset = 0
    for p in model.parameters():
        p.data.copy_(flat[offset:offset + p.numel()].view_as(p))
        offset += p.numel()
'''

SUM_NOT_MEAN = '''
def average_gradients(model):
    grads = [p.grad for p in model.parameters()]
    flat = torch.cat([g.reshape(-1) for g in grads])
    ring_all_reduce(flat)
    offset = 0
    for g in grads:
        g.copy_(flat[offset:offset + g.numel()].view_as(g))
        offset += g.numel()
'''

PER_PARAMETER = '''
def average_gradients(model):
    for p in model.parameters():
        ring_all_reduce(p.grad)
        p.grad /= dist.get_world_size()
'''


@pytest.mark.timeout(120)
@pytest.mark.parametrize("source, fragments", [
    (AVERAGE_PARAMETERS, ["differs from rank 0's", "not the parameters"]),
    (SUM_NOT_MEAN, ["differs from one process trained on the full batch", "divided by the world size"]),
    (PER_PARAMETER, ["call ring_all_reduce once"]),
], ids=["parameters", "sum", "per parameter"])
def test_wrong_gradient_averaging_fails(source, fragments):
    assert_fails("2.5", solution_namespace(source), *fragments)


STUB = '''
def ring_all_reduce(tensor):
    raise NotImplementedError("lab 2.4")
'''


@pytest.mark.timeout(120)
def test_not_implemented_is_reported_as_todo():
    result = check("2.4", solution_namespace(STUB))
    assert result.not_implemented == result.total > 0, result.lines
