"""Checks of lab 2.5: average_gradients with ring_all_reduce; ranks end identical and equal to one process."""
import torch
import torch.distributed as dist
import torch.nn.functional as F

from helpers.comm import CommLedger
from helpers.grading.checks.lab02 import common
from helpers.grading.checks.lab02.common import ATOL, RTOL, _launch
from helpers.grading.registry import answer, public_check

TRAIN_WORLD_SIZES = (2, 3)
TRAIN_STEPS, TRAIN_LR, TRAIN_BATCH = 3, 0.1, 12  # 12 samples: equal shards on 1, 2, 3 or 4 ranks


# --- 2.5 average_gradients: different data on every rank, identical parameters at the end ----------

def _tiny_model():
    torch.manual_seed(common.OFFSET)  # the same initial weights on every rank and in the single-process reference
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))


def _global_batch():
    generator = torch.Generator().manual_seed(1 + 7 * common.OFFSET)
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
