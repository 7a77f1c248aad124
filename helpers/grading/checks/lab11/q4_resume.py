"""Checks of lab 11.4: save_checkpoint / load_checkpoint, through a run killed at a step and resumed.

Three launches on 2 ranks: an uninterrupted run (recording, at the start of every step, what a resume must
restore), a run whose last rank dies (os._exit) in the middle of step CRASH_AT, and a relaunch that resumes from
the checkpoint. The loop is the lab's train_resumable, with records added; the student writes save and load.
A fourth launch, on 1 rank, tears a save in the middle of torch.save: the checkpoint before it must still load.
"""
import io
import os
import shutil
import tempfile

import torch
import torch.distributed as dist
import torch.nn.functional as F

from helpers.backend import rank_device
from helpers.grading.checks.lab11.common import HANG_S, _flat, _launch, _memoized
from helpers.grading.registry import answer, public_check
from helpers.grading.shared_run import definitions, launch_gloo

WORLD_SIZE, STEPS, CRASH_AT, SEED = 2, 5, 3, 5


def _momentum(optimizer):
    buffers = [optimizer.state[p].get("momentum_buffer") for group in optimizer.param_groups for p in group["params"]]
    return torch.cat([b.reshape(-1) for b in buffers]) if all(b is not None for b in buffers) else torch.zeros(0)


def _train(save_checkpoint, load_checkpoint, make_model, rank_batch, path, crash_at):
    """The lab's train_resumable; returns (first step, {step: (RNG, momentum, parameters) at its start}, final)."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    rank, device = dist.get_rank(), rank_device()
    model = DDP(make_model(SEED).to(device))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    torch.manual_seed(SEED + 1 + rank)  # dropout masks differ per rank
    start = load_checkpoint(path, model.module, optimizer) if os.path.exists(path) else 0
    if not isinstance(start, int):
        raise TypeError(f"load_checkpoint returned {start!r}: return the saved next step, an int")
    seen = {}
    for step in range(start, STEPS):
        seen[step] = (torch.get_rng_state(), _momentum(optimizer), _flat(model.module))
        x, y = rank_batch(SEED, step, rank, device)
        loss = F.mse_loss(model(x), y)
        if step == crash_at and rank == dist.get_world_size() - 1:
            os._exit(1)  # dies in the middle of the step: no exception, no cleanup
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        save_checkpoint(path, model.module, optimizer, step + 1)
    return start, seen, _flat(model.module)


def _runs(ns):
    from helpers.errors import RankFailed

    fns = tuple(answer(ns, name) for name in ("save_checkpoint", "load_checkpoint", "make_model", "rank_batch"))

    def run():
        root = tempfile.mkdtemp(prefix="lab11_4_")
        try:
            whole = _launch(_train, *fns, os.path.join(root, "whole.pt"), None, world_size=WORLD_SIZE)
            path = os.path.join(root, "crashed.pt")
            try:  # launch_gloo, not _launch: the crash is expected, it must reach us as RankFailed
                launch_gloo(_train, WORLD_SIZE, args=(*fns, path, CRASH_AT), hang_timeout=HANG_S)
            except RankFailed as exc:
                if exc.exitcode is None:
                    raise  # the student's code raised: its own message is the report
            else:
                raise AssertionError(f"the run with a crash at step {CRASH_AT} finished: it should have lost a rank")
            resumed = _launch(_train, *fns, path, None, world_size=WORLD_SIZE)
            return whole, resumed
        finally:
            shutil.rmtree(root, ignore_errors=True)

    return _memoized("11.4", definitions(ns), run)


@public_check("11.4")
def resumes_with_everything_the_next_step_needs(ns):
    whole, resumed = _runs(ns)
    for rank in range(WORLD_SIZE):
        start, seen, _ = resumed[rank]
        assert start == CRASH_AT, (
            f"rank {rank} resumed at step {start}; the last checkpoint was written after step {CRASH_AT - 1}, so the "
            f"run must go on at step {CRASH_AT}" + (": no checkpoint was found at `path`: save_checkpoint must write "
                                                    "that file" if start == 0 else
                                                    ": save next_step and return it from load_checkpoint"))
        rng, momentum, params = seen[start]
        rng_then, momentum_then, params_then = whole[rank][1][start]
        assert torch.equal(params, params_then), (
            f"rank {rank}: the parameters after load_checkpoint are not those saved: model.load_state_dict(...)")
        assert torch.equal(momentum, momentum_then), (
            f"rank {rank}: the optimizer's momentum was not restored, so SGD restarts without it: save "
            "optimizer.state_dict() and restore it with optimizer.load_state_dict")
        if not torch.equal(rng, rng_then):
            assert not (rank and torch.equal(rng, whole[0][1][start][0])), (
                f"rank {rank} restored rank 0's random state, so its dropout masks are rank 0's: gather every "
                "rank's torch.get_rng_state() (dist.all_gather_object) and restore rank r's on rank r")
            raise AssertionError(f"rank {rank}: the random state was not restored, so the dropout masks after the "
                                 "resume differ: save torch.get_rng_state() of every rank and restore it with "
                                 "torch.set_rng_state")


@public_check("11.4")
def resumed_run_equals_uninterrupted_bit_for_bit(ns):
    whole, resumed = _runs(ns)
    for rank in range(WORLD_SIZE):
        final, expected = resumed[rank][2], whole[rank][2]
        assert torch.equal(final, expected), (
            f"rank {rank}: after the crash at step {CRASH_AT} and the resume, the parameters differ from an "
            f"uninterrupted run of {STEPS} steps by up to {(final - expected).abs().max().item():.3g}; "
            "they must be equal bit for bit (torch.equal)")
    assert torch.equal(resumed[1][2], resumed[0][2]), "rank 1's parameters differ from rank 0's after the resume"


class _TornSave(Exception):
    """Raised by the torn torch.save below: the process "dies" half-way through writing a checkpoint."""


def torn_save(save_checkpoint, load_checkpoint, make_model, path, step, seed=SEED):
    """On 1 rank: a whole save at `step`, then a save of other parameters at step + 1 whose torch.save writes half
    of its bytes and fails; then what a resume loads: (next_step, the parameters saved whole, those loaded), or
    ("unreadable", the error). The public check runs it at CRASH_AT; lab 11's probe at a step and seed of its own."""
    device = rank_device()
    model = make_model(seed).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    save_checkpoint(path, model, optimizer, step)
    saved = _flat(model)
    whole_save = torch.save

    def torn(obj, f, *args, **kwargs):
        if isinstance(f, io.BytesIO):  # a tensor being pickled (all_gather_object's), not a file being written
            return whole_save(obj, f, *args, **kwargs)
        buffer = io.BytesIO()
        whole_save(obj, buffer, *args, **kwargs)
        half = buffer.getvalue()[: buffer.tell() // 2]
        if hasattr(f, "write"):
            f.write(half)
        else:
            with open(f, "wb") as out:
                out.write(half)
        raise _TornSave()

    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
    torch.save = torn  # in this rank's process only, which ends with the launch
    try:
        save_checkpoint(path, model, optimizer, step + 1)
    except _TornSave:
        pass
    finally:
        torch.save = whole_save
    fresh = make_model(seed + 1).to(device)
    try:
        loaded = load_checkpoint(path, fresh, torch.optim.SGD(fresh.parameters(), lr=0.05, momentum=0.9))
    except Exception as exc:  # noqa: BLE001 - a half-written file fails to unpickle in many ways
        return "unreadable", f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:200]
    return loaded, saved, _flat(fresh)


@public_check("11.4")
def a_crash_during_a_save_leaves_the_last_checkpoint_whole(ns):
    fns = tuple(answer(ns, name) for name in ("save_checkpoint", "load_checkpoint", "make_model"))
    step = CRASH_AT

    def run():
        root = tempfile.mkdtemp(prefix="lab11_4_torn_")
        try:
            return _launch(torn_save, *fns, os.path.join(root, "ckpt.pt"), step, world_size=1)[0]
        finally:
            shutil.rmtree(root, ignore_errors=True)

    outcome = _memoized("11.4 torn save", definitions(ns), run)
    atomic = ("write the file under another name (path + '.tmp') and then os.replace(path + '.tmp', path), which "
              "swaps the whole file in at once")
    if outcome[0] == "unreadable":
        raise AssertionError(f"a save that crashed half-way through torch.save left `path` unreadable "
                             f"({outcome[1]}), so the job cannot resume: {atomic}")
    loaded, saved, restored = outcome
    assert loaded == step and torch.equal(restored, saved), (
        f"after a whole save of step {step} and a save of step {step + 1} that crashed half-way through torch.save, "
        f"load_checkpoint returned step {loaded!r}" + ("" if loaded != step else " with other parameters") +
        f": the crashed save must leave the checkpoint of step {step} as it was; {atomic}")
