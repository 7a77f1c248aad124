"""Checks of lab 10.5: the student's FlatShard units (10.3) with hooks of their own that prefetch in backward.

The run is 10.3's (3 ranks, a GPT of 2 blocks, so 3 units: block 0, block 1, the root), with the student's
`register_hooks_with_prefetch(units, modules)` in place of lab 08's hooks. Every collective is read in the order the
rank issued it, with the unit whose buffers it moved (common._train_with_hooks). Backward needs the units in the
reverse of the order their forwards finished: the root (its head runs first), block 1, block 0. The rule of backward
prefetch (FSDP's BACKWARD_PRE): the all-gather of the next unit in that order is issued before the current block's
backward has finished, i.e. before the block's reduce-scatter, which its last gradient triggers. The bytes stay 10.3's:
two all-gathers and one reduce-scatter per unit and step, and only shards held between steps.
"""
from helpers.grading.checks.lab10.common import (
    HANG_S,
    WORLD_SIZE,
    _capstone,
    _memoized,
    _train_with_hooks,
    config,
    equal_to_torch,
    identical_parameters_from_different_data,
    torch_run,
)
from helpers.grading.checks.lab10.q3_flat_shard import BLOCKS, holds_only_shards
from helpers.grading.registry import public_check
from helpers.grading.shared_run import definitions, launch_on_gloo, run_failed

# A unit's backward that reads flat while its storage is freed (0 bytes) fails in torch before any check can look: the
# pre-backward found a stale work (a unit prefetched after its backward had passed, waited for in the next step) or
# none, and gathered nothing. Said as a hint, in the public check and in the hidden test.
FREED_ERROR = "out of bounds for storage of size 0"
FREED = ("a unit's backward read its parameters while they were freed (a storage of 0 bytes): its pre-backward "
         "found no all-gather of this step to wait for. Prefetch only the unit backward needs next (the reverse of "
         "the order in which the forwards finished), never one whose backward has passed, and take each work out "
         "when you wait for it. ")
HINT = ("Every rank must gather and reduce-scatter the same units in the same order, and wait for every prefetched "
        "all-gather (work.wait()) before its unit's backward runs. ")


def _runs(ns):
    """(yours, fully_shard's): your FlatShard (bring_flat_shard) with your hooks, and 10.3's fully_shard run."""
    from helpers.errors import RankFailed
    from helpers.grading.checks.lab10.common import brought
    from helpers.grading.registry import answer

    register = answer(ns, "register_hooks_with_prefetch")
    answer(ns, "bring_flat_shard")
    cfg, data = config(n_layer=BLOCKS), _capstone("data").load_corpus()[1]

    def mine():
        FlatShard = brought(ns, "bring_flat_shard", "10.5", lambda c: isinstance(c, type),
                            "return the class itself: end bring_flat_shard with `return FlatShard` (10.3)")
        try:
            return launch_on_gloo(_train_with_hooks, WORLD_SIZE, (FlatShard, register, data, cfg), HANG_S, HINT)
        except RankFailed as exc:
            if FREED_ERROR not in str(exc):
                raise
            raise run_failed(exc, FREED) from None
    return _memoized("10.5", definitions(ns), mine), torch_run("10.3", "flatshard", cfg, data)


def unit_name(index, units):
    return f"unit {index} (the root)" if index == units - 1 else f"unit {index} (block {index})"


def _steps(mine):
    """[(where, units, [(op, unit, phase)])] of every rank's steps."""
    units = len(mine[0]["layout"]["units"])
    return [(f"rank {rank}, step {step}", units, [tuple(event) for event in events])
            for rank, out in enumerate(mine) for step, events in enumerate(out["order"])]


@public_check("10.5")
def different_data_identical_parameters(ns):
    mine, _ = _runs(ns)
    identical_parameters_from_different_data(mine, "every rank must wait for each prefetched all-gather before its "
                                                   "unit's backward runs, and reduce-scatter every unit's gradient")


@public_check("10.5")
def two_all_gathers_and_one_reduce_scatter_per_unit(ns):
    """Prefetch moves an all-gather earlier, it adds none: 10.3's collectives, unit by unit."""
    mine, _ = _runs(ns)
    for where, units, events in _steps(mine):
        for op, unit, phase in events:
            assert op in ("all_gather", "reduce_scatter"), (
                f"{where}: your hooks issued a {op} in {phase}; FSDP only all-gathers parameters and reduce-scatters "
                "gradients")
            assert unit >= 0, (f"{where}: a {op} in {phase} moved none of the units' buffers; gather into "
                               "unit.flat.data from unit.flat_shard.data, as unshard() does")
        for unit in range(units):
            name = unit_name(unit, units)
            scatter = ("reduce_scatter", unit, "backward")
            done = events.index(scatter) if scatter in events else len(events)
            assert ("all_gather", unit, "backward") not in events[done:], (
                f"{where}: {name} was all-gathered after its own backward had finished (its reduce-scatter): the "
                "prefetch went to a unit backward has passed; prefetch the unit backward needs next, in the reverse of "
                "the order in which the forwards finished")
            count = {key: sum(1 for event in events if event == (key[0], unit, key[1]))
                     for key in (("all_gather", "forward"), ("all_gather", "backward"), ("reduce_scatter", "backward"))}
            gathers = count["all_gather", "backward"]
            assert gathers <= 1, (
                f"{where}: {name} was all-gathered {gathers} times in backward; once per backward: at the pre-backward "
                "of a unit you prefetched, wait for the prefetch's work (work.wait()) instead of gathering again, and "
                "prefetch only the unit backward needs next")
            assert gathers == 1, (
                f"{where}: {name} was never all-gathered in backward; its backward needs its parameters again: gather "
                "it at its pre-backward unless a prefetch did")
            assert count["all_gather", "forward"] == 1, (
                f"{where}: {name} was all-gathered {count['all_gather', 'forward']} times in forward; keep lab 08's "
                "forward: one unshard() in each unit's pre-forward")
            assert count["reduce_scatter", "backward"] == 1, (
                f"{where}: {name}'s gradient was reduce-scattered {count['reduce_scatter', 'backward']} times; once "
                "per step, when its flat.grad is complete (lab 08's post-backward)")


@public_check("10.5")
def next_unit_gathered_before_this_block_finishes_backward(ns):
    """Backward prefetch: the next unit's all-gather issued at this block's pre-backward, before its reduce-scatter."""
    mine, _ = _runs(ns)
    for where, units, events in _steps(mine):
        needed = [units - 1, *reversed(range(units - 1))]   # the root (its head runs first), then the blocks
        gathered = list(dict.fromkeys(unit for op, unit, phase in events if op == "all_gather" and phase == "backward"))
        names = ", ".join(unit_name(unit, units) for unit in needed)
        assert gathered == needed, (
            f"{where}: in backward the units were all-gathered in the order {gathered}, but backward needs them in the "
            f"order {needed} ({names}): the reverse of the order their forwards finished; prefetch the unit that "
            "comes next in that order")
        for this, following in zip(needed[1:], needed[2:]):   # block after block (the root's reduce-scatter is last)
            issued = events.index(("all_gather", following, "backward"))
            finished = events.index(("reduce_scatter", this, "backward"))
            assert issued < finished, (
                f"{where}: the all-gather of {unit_name(following, units)} was issued after "
                f"{unit_name(this, units)}'s backward had finished (its reduce-scatter): issue it at "
                f"{unit_name(this, units)}'s pre-backward, before it computes (async_op=True), and wait for it at "
                f"{unit_name(following, units)}'s")


@public_check("10.5")
def equals_fully_shard(ns):
    mine, theirs = _runs(ns)
    equal_to_torch(mine, theirs, "FSDP2 fully_shard",
                   grads_hint="wait for a prefetched all-gather (work.wait()) before its unit's backward reads flat",
                   params_hint="every unit's gradient reduce-scattered once per step, after its prefetch completed")


@public_check("10.5")
def holds_only_shards_between_steps(ns):
    mine, _ = _runs(ns)
    holds_only_shards(mine, "after each unit's reduce-scatter call unit.reshard(), a prefetched unit too")
