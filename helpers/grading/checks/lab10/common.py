"""Shared pieces of lab 10's checks: the capstone's code, the sizes, the two memoized runs, the shared invariants.

A question runs the student's component once (`yours.train` on WORLD_SIZE Gloo ranks), keyed by every function and
class in their namespace (shared_run.definitions: a fixed Reducer reruns even if the bring function was not rerun), and
PyTorch's counterpart once per process, keyed by the sizes (it does not depend on the answer); every check of the
question reads those two runs.
"""
import importlib
import math
import pathlib
import sys

import cloudpickle

from helpers.grading.shared_run import SharedRun, definitions, launch_on_gloo

WORLD_SIZE = 3
HANG_S = 30.0
CHAPTERS = pathlib.Path(__file__).resolve().parents[4] / "chapters"
# The checks' runs: a GPT of 1 block (10.3: 2 blocks, 3 units), 3 AdamW steps, 4 KiB buckets (4 of them here).
SIZES = {"steps": 3, "batch_size": 2, "block_size": 8, "n_layer": 1, "n_head": 2, "n_embd": 16, "lr": 1e-2,
         "seed": 1, "bucket_cap_mb": 4 / 1024}
# Yours vs PyTorch's on the same batches. Measured with the solution at these sizes: the losses equal, the first
# mean gradient within 6e-8 (1.1e-7 of its largest entry), the parameters within 1.0e-5. Parameters drift most:
# AdamW's update m / (sqrt(v) + eps) has the size of lr = 1e-2 even for a gradient entry made of rounding noise (the
# ranks add in another order than PyTorch). A real bug (a gradient left unaveraged, L2 instead of decoupled decay)
# moves parameters by about lr per step. Gradients are compared relative to their largest entry.
TOL_LOSS, TOL_PARAMS, TOL_GRADS = 1e-5, 1e-4, 1e-5

_memoized = SharedRun()  # one launch serves every check of a question


def _capstone(module):
    """chapters/capstone/<module>.py, as the lab imports it; the package travels to the ranks by value."""
    if str(CHAPTERS) not in sys.path:
        sys.path.insert(0, str(CHAPTERS))
    cloudpickle.register_pickle_by_value(importlib.import_module("capstone"))
    return importlib.import_module(f"capstone.{module}")


def config(**changes):
    return _capstone("yours").CapstoneConfig(**{**SIZES, **changes})


def _train_on_rank(kind, component, data, cfg):
    return _capstone("yours").train(kind, data, cfg, component)


def _train_with_hooks(FlatShard, register, data, cfg):
    """On every rank: yours.train of FlatShardRun with the student's hooks (10.5), `register(units, modules)` in place
    of yours.register_hooks. Beside train's results, "order": per step, every collective in the order this rank
    issued it, as [op, the index of its unit (-1: none), "forward" or "backward"]: the unit whose unshard() or
    reduce_scatter_grads() issued it, else whose flat_shard, flat or flat.grad it moved (the student's prefetch)."""
    from helpers.comm import CommLedger

    yours = _capstone("yours")

    class HooksRun(yours.FlatShardRun):
        events = []   # per step, [op, unit, phase] per collective

        def __init__(self, gpt, cfg):   # FlatShardRun's, with register(units, modules) for the hooks
            self.numels = {name: p.numel() for name, p in gpt.named_parameters()}
            self.order = [[f"h.{i}.{name}" for name, _ in block.named_parameters()] for i, block in enumerate(gpt.h)]
            self.order.append([n for n in self.numels if not n.startswith("h.")])
            self.model = gpt
            yours.tie_head_to_embedding(gpt)
            self.units = [FlatShard(block) for block in gpt.h] + [FlatShard(gpt)]   # bottom-up, the root last
            self.inside = None   # the unit whose unshard() or reduce_scatter_grads() is running
            for index, unit in enumerate(self.units):
                for method in ("unshard", "reduce_scatter_grads"):
                    setattr(unit, method, self._of_unit(index, getattr(unit, method)))
            register(self.units, [*gpt.h, gpt])
            self.optimizer = yours.adamw(gpt.parameters(), cfg)

        def step(self, x, y):
            events, phase = [], ["forward"]
            HooksRun.events.append(events)
            note = lambda record, tensors, args: events.append([record.op, self._unit_of(tensors), phase[0]])  # noqa: E731
            self.optimizer.zero_grad(set_to_none=True)
            with CommLedger(check=note, keep_records=False):   # sees each collective before it runs
                _, loss = self.model(x, y)
                phase[0] = "backward"
                loss.backward()
            self.optimizer.step()
            return loss.detach()

        def _of_unit(self, index, method):
            """The unit's method, marking the collectives it issues as the unit's (whatever buffers they use)."""
            def call(*args, **kwargs):
                outer, self.inside = self.inside, index
                try:
                    return method(*args, **kwargs)
                finally:
                    self.inside = outer
            return call

        def _unit_of(self, tensors):
            """The unit whose method issues the collective; else whose flat_shard, flat or flat.grad it reads or writes
            (their storage; a prefetch of the student's own); else -1."""
            if self.inside is not None:
                return self.inside

            def storages(ts):
                return {t.untyped_storage().data_ptr() for t in ts if t is not None and t.untyped_storage().nbytes()}
            used = storages(tensors)
            return next((i for i, unit in enumerate(self.units)
                         if used & storages([unit.flat_shard, unit.flat, unit.flat.grad])), -1)

    yours.RUNS["flatshard_hooks"] = (HooksRun, "zero3")   # on this rank only: yours.train builds it by its kind
    try:
        out = yours.train("flatshard_hooks", data, cfg)
    finally:
        del yours.RUNS["flatshard_hooks"]
    return {**out, "order": HooksRun.events}


def brought(ns, name, question, valid, what):
    """The component the student's bring function returns, after a look at its type (in the kernel, no ranks)."""
    from helpers.grading.registry import answer

    component = answer(ns, name)()
    assert valid(component), f"{name}() returned {type(component).__name__} {str(component)[:60]}; {what}"
    return component


def runs(ns, question, kind, name, valid, what, *, hint="", **changes):
    """(yours, PyTorch's): per rank, what `yours.train` returns, at SIZES with `changes`."""
    from helpers.grading.registry import answer

    answer(ns, name)  # not defined: "run the cell that defines it", before any launch
    cfg, data = config(**changes), _capstone("data").load_corpus()[1]

    def mine():
        component = brought(ns, name, question, valid, what)
        return launch_on_gloo(_train_on_rank, WORLD_SIZE, (kind, component, data, cfg), HANG_S, hint)

    return _memoized(question, definitions(ns), mine), torch_run(question, kind, cfg, data)


def torch_run(question, kind, cfg, data):
    """PyTorch's counterpart of `kind` at cfg, per rank: one launch per process and sizes (10.5 reads 10.3's)."""
    def theirs():
        counterpart = _capstone("yours").YOURS[kind]
        return launch_on_gloo(_train_on_rank, WORLD_SIZE, (counterpart, None, data, cfg), HANG_S)
    return _memoized(f"{question}/torch", repr(cfg), theirs)


def identical_parameters_from_different_data(mine, what):
    """The invariant of every lab: every rank read its own batches and ends with rank 0's parameters, bit for bit."""
    digests = [rank["batches"] for rank in mine]
    assert len(set(digests)) == len(digests), f"two ranks read the same batches: {digests}"
    for rank, out in enumerate(mine[1:], start=1):
        gap = (out["params"] - mine[0]["params"]).abs().max().item()
        assert gap == 0, (f"after {len(out['losses'])} steps rank {rank}'s parameters differ from rank 0's by "
                          f"{gap:.3g}; {what}")


def gap(a, b):
    return (a - b).abs().max().item()


def equal_to_torch(mine, theirs, name, *, grads_hint, params_hint):
    """Yours against PyTorch's on the same batches: the first mean gradient, the final parameters, every loss.

    The first step's gradient is computed at the same parameters in both runs: a difference there is the
    synchronisation's; later gradients also differ when the updates do."""
    ours, ref = mine[0], theirs[0]
    scale = ref["grads"].abs().max().item()
    grad_gap = gap(ours["grads"], ref["grads"])
    ratio = ours["grads"].norm().item() / max(ref["grads"].norm().item(), 1e-30)
    if not grad_gap <= TOL_GRADS * scale and abs(ratio - WORLD_SIZE) < 1e-3 * WORLD_SIZE:
        raise AssertionError(f"the first step's gradient is {WORLD_SIZE} times {name}'s: the SUM over the "
                             f"{WORLD_SIZE} ranks; divide by the world size to get the mean")
    assert grad_gap <= TOL_GRADS * scale, (
        f"the first step's mean gradient differs from {name}'s by {grad_gap:.3g} (largest entry {scale:.3g}, "
        f"tolerance {TOL_GRADS:g} of it); {grads_hint}")
    param_gap = gap(ours["params"], ref["params"])
    assert param_gap < TOL_PARAMS, (
        f"after {len(ours['losses'])} steps the parameters differ from {name}'s by {param_gap:.3g} (tolerance "
        f"{TOL_PARAMS:g}); {params_hint}")
    loss_gap = max(abs(a - b) for a, b in zip(ours["losses"], ref["losses"]))
    assert loss_gap < TOL_LOSS and not math.isnan(loss_gap), (
        f"the losses differ from {name}'s on the same batches by up to {loss_gap:.3g} (tolerance {TOL_LOSS:g})")


def per_step(mine):
    """[(rank, step, {op: {"calls", "payload_bytes", "wire_bytes"}})] of every rank's ledgers."""
    return [(rank, step, ops) for rank, out in enumerate(mine) for step, ops in enumerate(out["comm"])]
