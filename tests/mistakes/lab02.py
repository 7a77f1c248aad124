"""Lab 02 (collectives from point-to-point): chapter 02's naive versions and the tutorial bugs, as 2.1 to 2.5 see them.

Each wrong answer is held to its first line and, in `mentions`, to the details the rest of its report must give (the
world size, the rank, the bytes measured): tests/test_lab02_checks.py asserted those on a run of its own until the two
shared one run per wrong answer here.
"""
from helpers.grading.prepare.labgen import ROOT
from tests.mistakes import Mistake

SOLUTION = ROOT / "solutions" / "02_collectives.ipynb"

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

MISTAKES = [
    Mistake("2.1", "blocking send before recv on every rank", BLOCKING_EXCHANGE,
            ("hung", "dist.isend/dist.irecv"), run_fails=True,
            mentions=("exchange_with_neighbours hung at world size 2", "rank 0: blocked in send #1")),
    Mistake("2.1", "neighbours swapped", SWAPPED_EXCHANGE, ("from_left",),
            mentions=("from_left (rank 2's tensor)", "world size 3")),
    Mistake("2.1", "dist.all_gather instead of point-to-point", '''
def exchange_with_neighbours(t):
    rank, n = dist.get_rank(), dist.get_world_size()
    everyone = [torch.empty_like(t) for _ in range(n)]
    dist.all_gather(everyone, t)
    return everyone[(rank - 1) % n], everyone[(rank + 1) % n]
''', ("all_gather", "point-to-point")),
    Mistake("2.2", "chapter 02's schedule unchanged: keeps the wrong chunk", WRONG_CHUNK_REDUCE_SCATTER,
            ("chunk 0 of",), mentions=("world size 2, rank 0",)),
    Mistake("2.2", "pads to a multiple of N: padding on the wire", PADDED_REDUCE_SCATTER, ("no padding",)),
    Mistake("2.3", "stores each arriving chunk one place off", SHIFTED_ALL_GATHER,
            ("every rank's chunk, in rank order",),
            mentions=("the gathered vector (every rank's chunk, in rank order) is wrong",)),
    Mistake("2.3", "dist.all_gather", GATHER_WITH_TORCH, ("called all_gather", "point-to-point")),
    Mistake("2.4", "the whole tensor round the ring (the tutorial bug)", UNCHUNKED_RING,
            ("whole tensor passed round the ring",), mentions=("2.000 S",)),
    Mistake("2.4", "naive: everyone to rank 0 and back", NAIVE_ALL_REDUCE, ("a root that sends it",),
            mentions=("rank 0 sent", "2.000 S", "a root that sends it to everyone")),
    Mistake("2.4", "dist.all_reduce", TORCH_ALL_REDUCE, ("called all_reduce", "point-to-point")),
    Mistake("2.4", "returns the sum but leaves tensor unchanged", NOT_IN_PLACE, ("in place",)),
    Mistake("2.5", "averages the parameters (the picotron bug)", AVERAGE_PARAMETERS, ("not the parameters",),
            mentions=("differs from rank 0's",)),
    Mistake("2.5", "sum without the division", SUM_NOT_MEAN, ("divided by the world size",),
            mentions=("differs from one process trained on the full batch",)),
    Mistake("2.5", "one ring_all_reduce per parameter", PER_PARAMETER, ("call ring_all_reduce once",)),
]
