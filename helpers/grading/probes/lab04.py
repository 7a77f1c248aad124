"""Hidden tests of lab 04 (bucketing and overlap). Public in this repository: see the README."""
import dataclasses

from helpers.grading.probes import Probe

SETUP = '''
import torch as _probe_torch
import torch.distributed as _probe_dist
import torch.nn.functional as _probe_F
from helpers.grading.shared_run import launch_gloo as _probe_launch
from helpers.comm import CommLedger as _probe_Ledger

def _probe_sizes(count, largest):
    """Parameter sizes drawn from the question's secret seed."""
    g = _probe_torch.Generator().manual_seed(_PROBE_SEED)
    return _probe_torch.randint(1, largest + 1, (count,), generator=g).tolist()

def _probe_model():
    _probe_torch.manual_seed(_PROBE_SEED + 30 + _probe_dist.get_rank())     # different init: the Reducer broadcasts
    return _probe_torch.nn.Sequential(*[_probe_torch.nn.Linear(6, 6) for _ in range(5)])

def _probe_batches(steps):
    g = _probe_torch.Generator().manual_seed(_PROBE_SEED + 40 + _probe_dist.get_rank())
    return [(_probe_torch.randn(4, 6, generator=g), _probe_torch.randn(4, 6, generator=g)) for _ in range(steps)]

def _probe_bucket():
    _probe_torch.manual_seed(_PROBE_SEED + 50 + _probe_dist.get_rank())
    params = [_probe_torch.nn.Parameter(_probe_torch.randn(3)) for _ in range(2)]
    for p in params:
        p.grad = _probe_torch.randn(3)
    bucket = Bucket(params)
    for p in reversed(params):
        bucket.add_grad(p)
    bucket.finish()
    return [p.grad for p in params]

def _probe_reducer_calls():
    model = _probe_model()
    reducer = Reducer(model, bucket_cap_mb=400 / 2**20)        # ~400 bytes: a few buckets
    x, y = _probe_batches(1)[0]
    with _probe_Ledger() as ledger:
        _probe_F.mse_loss(model(x), y).backward()
        reducer.finalize()
    return {"calls": ledger.totals()["all_reduce"]["calls"], "grads": [p.grad for p in model.parameters()]}

def _probe_train():
    model = _probe_model()
    losses = train_bucketed(model, _probe_batches(3), 0.05, 300 / 2**20)
    return {"losses": losses, "params": [p.detach() for p in model.parameters()]}

def _probe_wrapped(steps):
    """The user's loop around BucketedDDP, then one step begun before the last was synchronized."""
    model = _probe_model()
    ddp = BucketedDDP(model, bucket_cap_mb=300 / 2**20)
    optimizer = _probe_torch.optim.SGD(ddp.parameters(), lr=0.05)
    batches, losses = _probe_batches(steps + 1), []
    with _probe_Ledger() as ledger:
        for x, y in batches[:steps]:
            optimizer.zero_grad(set_to_none=True)
            loss = _probe_F.mse_loss(ddp(x), y)
            loss.backward()
            ddp.finish_gradient_synchronization()
            optimizer.step()
            losses.append(loss.item())
    x, y = batches[steps]
    _probe_F.mse_loss(ddp(x), y).backward()
    try:
        ddp(x)
        second_forward = "ran"
    except Exception as exc:
        second_forward = type(exc).__name__
    ddp.finish_gradient_synchronization()
    return {"losses": losses, "params": [p.detach() for p in model.parameters()], "second_forward": second_forward,
            "calls": ledger.totals()["all_reduce"]["calls"], "keys": list(ddp.state_dict())}
'''

PROBES = [
    Probe("4.1", "ten parameters of secret sizes, 100-byte cap",
          "assign_buckets([_probe_torch.empty(n) for n in _probe_sizes(10, 30)], 100)"),
    Probe("4.1", "a cap larger than the model",
          "assign_buckets([_probe_torch.empty(n) for n in _probe_sizes(2 + _PROBE_SEED % 5, 9)], 10**6)"),
    Probe("4.2", "3 ranks, one bucket of two tensors", "_probe_launch(_probe_bucket, 3, hang_timeout=10)", points=2),
    Probe("4.3", "3 ranks: bucket count and averaged gradients",
          "_probe_launch(_probe_reducer_calls, 3, hang_timeout=10)", points=2),
    Probe("4.4", "3 ranks, 3 steps", "_probe_launch(_probe_train, 3, hang_timeout=20)", points=2),
    Probe("4.5", "3 ranks: 3 steps through the wrapper, then a forward before the gradients were synchronized",
          "_probe_launch(_probe_wrapped, 3, args=(3,), hang_timeout=20)", points=2),
]

# Using DDP's own bucketing (or DDP itself) scores 0 on the questions that rebuild it.
_FORBIDDEN = ("_compute_bucket_assignment_by_size", "DistributedDataParallel")
PROBES = [dataclasses.replace(p, forbidden=_FORBIDDEN) for p in PROBES]

# The earlier answers each question's probes call, directly or through other answers, graded with the
# solution's versions bound in their place (helpers/grading/reference.py): Reducer fills Buckets from assign_buckets;
# train_bucketed and BucketedDDP build a Reducer.
USES = {'4.3': ('4.1', '4.2'), '4.4': ('4.1', '4.2', '4.3'), '4.5': ('4.1', '4.2', '4.3')}
