"""Hidden tests of lab 11 (operating data parallelism). Public in this repository: see the README.

Each probe runs the student's fixed function on ranks with data, sizes, steps and (11.4) the crash step drawn from
the question's secret seed, and returns raw values: counts, update counts, parameters (scored). A wrong value is named
by the question's public checks, recorded in the kernel once per probe cell (11.2's and 11.3's models and data moved
by the checks' OFFSET from the secret seed) and replayed in the grader (helpers/grading/judge/replay.py).
"""
import dataclasses
import functools

from helpers.grading.judge.replay import record_setup
from helpers.grading.probes import Probe
from helpers.grading.probes.judges import replayed

COMMON = "helpers.grading.checks.lab11.common"
OFFSETS = 1  # the records run the public checks on their own inputs (OFFSET 0): the scored values are the probes'

ANSWERS = {"11.1": ("class_counts",), "11.2": ("train_until",), "11.3": ("train_ddp", "WithAuxHead"),
           "11.4": ("save_checkpoint", "load_checkpoint", "make_model", "rank_batch")}

SETUP = record_setup(COMMON, "0") + '''


def _probe_with_record(value, question, answers, names):
    """{"value": value()} or, when it raises, {"failed": its class}; with the record of the question's checks."""
    record = _probe_record(question, answers, names)
    try:
        return {"value": value(), "record": record}
    except NotImplementedError:
        raise
    except Exception as exc:
        return {"failed": type(exc).__name__, "record": record}

import os as _probe_os
import shutil as _probe_shutil
import tempfile as _probe_tempfile

import torch as _probe_torch
import torch.distributed as _probe_dist
import torch.nn.functional as _probe_F
from helpers.backend import rank_device as _probe_device
from helpers.errors import RankFailed as _probe_RankFailed
from helpers.grading.shared_run import launch_gloo as _probe_launch


def _probe_counts():
    num_classes = 4 + _PROBE_SEED % 4
    g = _probe_torch.Generator().manual_seed(_PROBE_SEED + _probe_dist.get_rank())
    top = num_classes - _probe_dist.get_rank()         # rank r never sees the last r classes
    labels = _probe_torch.randint(0, top, (3 + _PROBE_SEED % 5,), generator=g)
    return class_counts(labels.to(_probe_device()), num_classes).cpu()


def _probe_shards(world_size):
    out = []
    for rank in range(world_size):
        g = _probe_torch.Generator().manual_seed(_PROBE_SEED * 10 + rank)
        X = _probe_torch.randn(5, 3, generator=g)
        out.append((X, X.sum(1, keepdim=True) * (1 + rank) + 0.3 * rank))
    return out


def _probe_model():
    _probe_torch.manual_seed(_PROBE_SEED)
    return _probe_torch.nn.Linear(3, 1)


def _probe_target(world_size, lr):
    """Halfway between the mean losses before updates k and k + 1, k from the seed: one process, no student code."""
    model, shards, seen = _probe_model(), _probe_shards(world_size), []
    for _ in range(2 + _PROBE_SEED % 4 + 2):
        losses = [_probe_F.mse_loss(model(X), Y) for X, Y in shards]
        seen.append(sum(l.item() for l in losses) / world_size)
        model.zero_grad()
        (sum(losses) / world_size).backward()
        with _probe_torch.no_grad():
            for p in model.parameters():
                p -= lr * p.grad
    k = 2 + _PROBE_SEED % 4
    return (seen[k] + seen[k + 1]) / 2


def _probe_until(target, lr):
    model = _probe_model().to(_probe_device())
    X, Y = (t.to(_probe_device()) for t in _probe_shards(_probe_dist.get_world_size())[_probe_dist.get_rank()])
    steps = train_until(model, X, Y, target=target, lr=lr, max_steps=12)
    return {"updates": steps, "params": [p.detach().cpu() for p in model.parameters()]}


def _probe_ddp():
    _probe_torch.manual_seed(_PROBE_SEED)
    model = WithAuxHead(3 + _PROBE_SEED % 3, 2).to(_probe_device())
    g = _probe_torch.Generator().manual_seed(_PROBE_SEED + 30 + _probe_dist.get_rank())
    X = _probe_torch.randn(4, 3 + _PROBE_SEED % 3, generator=g).to(_probe_device())
    Y = _probe_torch.randn(4, 2, generator=g).to(_probe_device())
    train_ddp(model, X, Y, lr=0.05, steps=2 + _PROBE_SEED % 3)
    return [p.detach().cpu() for p in model.parameters()]


def _probe_resume():
    """Crash at a step from the seed, resume; the resumed run's parameters on every rank."""
    steps = 4 + _PROBE_SEED % 3
    crash_at, seed = 1 + _PROBE_SEED % (steps - 1), _PROBE_SEED % 1000
    root = _probe_tempfile.mkdtemp(prefix="probe11_")
    path = _probe_os.path.join(root, "ckpt.pt")
    try:
        try:
            _probe_launch(train_resumable, 2, args=(path, steps, seed, crash_at), hang_timeout=20)
        except _probe_RankFailed as error:
            if error.exitcode is None:   # an exception in the answer (not the planted crash): report it
                raise
        return _probe_launch(train_resumable, 2, args=(path, steps, seed), hang_timeout=20)
    finally:
        _probe_shutil.rmtree(root, ignore_errors=True)


def _probe_torn_save():
    """A save torn half-way through torch.save, at a step and a seed from the secret seed: what a resume loads."""
    from helpers.grading.checks.lab11.q4_resume import torn_save

    root = _probe_tempfile.mkdtemp(prefix="probe11_torn_")
    try:
        return _probe_launch(torn_save, 1, args=(save_checkpoint, load_checkpoint, make_model,
                                                 _probe_os.path.join(root, "ckpt.pt"), 2 + _PROBE_SEED % 7,
                                                 _PROBE_SEED % 1000), hang_timeout=20)[0]
    finally:
        _probe_shutil.rmtree(root, ignore_errors=True)
'''

PROBES = [
    # Sizes, data, steps and the crash step come from the question's secret seed: memorised outputs score 0.
    Probe("11.1", "3 ranks, 4-7 classes, rank r missing the last r classes",
          "_probe_launch(_probe_counts, 3, hang_timeout=10, check_collectives=True)", points=2),
    Probe("11.2", "3 ranks, a target the mean loss reaches after 2-5 updates",
          "_probe_launch(_probe_until, 3, args=(_probe_target(3, 0.1), 0.1), hang_timeout=10)", points=2),
    Probe("11.3", "3 ranks, 2-4 steps, an unused auxiliary head",
          "_probe_launch(_probe_ddp, 3, hang_timeout=10)", points=2),
    Probe("11.4", "2 ranks, 4-6 steps, a crash at a step from the seed, resumed",
          "_probe_resume()", points=3, rtol=0.0, atol=0.0),
    Probe("11.4", "a save torn half-way through torch.save leaves the checkpoint before it whole",
          "_probe_torn_save()", points=1, rtol=0.0, atol=0.0),
]

@functools.cache
def _given():
    """The released lab's WithAuxHead (11.3's checks build their reference with it), from its own cells."""
    import nbformat

    from helpers.grading.judge.reference import kept
    from helpers.grading.prepare.labgen import ROOT

    lab = nbformat.read(next((ROOT / "labs").glob("11_*.ipynb")), as_version=4)
    namespace = {"__name__": "_probe_lab11_given"}
    for cell in lab.cells:
        if cell.cell_type == "code" and not cell.get("metadata", {}).get("dp_course", {}).get("answers"):
            exec(compile(kept(cell), "<lab 11>", "exec"), namespace)  # noqa: S102 - the released lab's given code
    return {"WithAuxHead": namespace["WithAuxHead"]}


def _recorded(probe):
    """The probe's value (scored), and the record of its question's public checks (what names a wrong value)."""
    answers = ANSWERS[probe.question]
    given = _given if probe.question == "11.3" else None
    expr = (f'_probe_with_record(lambda: {probe.expr}, {probe.question!r}, ({", ".join(answers)},), '
            f'{answers[:1]!r})')
    return dataclasses.replace(probe, expr=expr, judge=replayed(
        probe.question, COMMON, OFFSETS, [a for a in answers if a != "WithAuxHead"], record="record",
        project=lambda value: value.get("value"), rtol=probe.rtol, atol=probe.atol, given=given))


PROBES = [_recorded(p) for p in PROBES]

# No question's probes call another question's answer (helpers/grading/judge/reference.py).
USES = {}
