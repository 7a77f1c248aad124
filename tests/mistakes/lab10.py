"""Lab 10 (the capstone with your own components): each mistake is the solution's bring function with one edit.

10.1 the Reducer: the hook copies the parameter, the bucket's sum is never divided, finish() leaves each rank its
own gradient, the class not returned. 10.2 ZeRO-2: an all-reduce and a slice (a hidden all-reduce), the sum, the
full gradients kept, L2 instead of decoupled weight decay. 10.3 FlatShard: the reduce-scatter's sum, reshard()
that frees nothing, the class not returned. 10.5 the hooks with prefetch: no prefetch, the prefetched unit gathered
again, the forward order instead of its reverse, no reshard after the reduce-scatter.
"""
import sys

import nbformat

from helpers.grading.prepare.labgen import ROOT
from tests.mistakes import Mistake

SOLUTION = ROOT / "solutions" / "10_capstone_gpt.ipynb"
# The lab's imports cell puts chapters/ on sys.path and ships capstone by value; definitions() keeps only its
# imports, so the path is set here and each wrong answer registers capstone again.
if str(ROOT / "chapters") not in sys.path:
    sys.path.insert(0, str(ROOT / "chapters"))
_GIVEN = "\ncloudpickle.register_pickle_by_value(capstone)\ntorch.set_num_threads(1)\n"
_CELLS = {c.id: c.source for c in nbformat.read(SOLUTION, as_version=4).cells}


def _edit(cell, old, new):
    """The solution's answer cell with one edit (the edit must apply: the solution may have changed)."""
    source = _CELLS[cell]
    assert source.count(old) == 1, f"{cell}: {old!r} is not in the solution once; update the mistake"
    return _GIVEN + source.replace(old, new)


_MISTAKES = [
    Mistake("10.1", "the hook copies the parameter, not its gradient (chapter 03's bug)",
            _edit("q101", "self.views[param].copy_(param.grad)", "self.views[param].copy_(param)"),
            ("mean gradient differs from torch DDP's", "copy param.grad (not param)")),
    Mistake("10.1", "the bucket's sum never divided by the world size",
            _edit("q101", "self.buffer.div_(dist.get_world_size())", "pass"),
            ("the SUM over the 3 ranks", "divide by the world size")),
    Mistake("10.1", "finish() waits but copies nothing back: each rank steps with its own gradient",
            _edit("q101", "p.grad.copy_(self.views[p])", "pass"),
            ("rank 1's parameters differ from rank 0's", "copy the mean back into every p.grad")),
    Mistake("10.1", "the pasted code without the return", _edit("q101", "    return Reducer\n", ""),
            ("bring_reducer() returned NoneType", "return Reducer")),

    Mistake("10.2", "an all-reduce, then a slice: the right values, a hidden all-reduce",
            _edit("q102", "dist.reduce_scatter_single(shard, flat)",
                  "dist.all_reduce(flat)\n        shard.copy_(flat.view(world_size, -1)[dist.get_rank()])"),
            ("issued 1 all-reduce(s)", "reduce-scatters the flat gradient")),
    Mistake("10.2", "the reduce-scatter's sum never divided",
            _edit("q102", "return shard.div_(world_size)", "return shard"),
            ("the SUM over the 3 ranks", "divide by the world size")),
    Mistake("10.2", "the full gradients kept after the reduce-scatter",
            _edit("q102", "        for p in params:\n            p.grad = None\n", ""),
            ("bytes of gradients between steps", "set every p.grad = None")),
    Mistake("10.2", "L2 regularisation instead of AdamW's decoupled weight decay",
            _edit("q102", "shard.mul_(1 - lr * weight_decay)  ", "grad_shard = grad_shard + weight_decay * shard  "),
            ("parameters differ from torch ZeroRedundancyOptimizer's", "DECOUPLED weight decay")),

    Mistake("10.3", "the reduce-scatter's sum never divided", _edit("q103", "grad.div_(dist.get_world_size())", "pass"),
            ("the SUM over the 3 ranks", "divide by the world size")),
    Mistake("10.3", "reshard() takes the views off but frees nothing",
            _edit("q103", "self.flat.untyped_storage().resize_(0)      # every view", "pass      # every view"),
            ("bytes in the units' full flat buffers", "resize_(0)")),
    Mistake("10.3", "the pasted code without the return", _edit("q103", "    return FlatShard\n", ""),
            ("bring_flat_shard() returned NoneType", "return FlatShard")),

    Mistake("10.5", "no prefetch: each unit gathered at its own pre-backward, lab 08's hooks",
            _edit("q105", "prefetch(backward[following])  # in flight", "pass  # in flight"),
            ("the all-gather of unit 0 (block 0) was issued after unit 1 (block 1)'s backward had finished",
             "issue it at unit 1 (block 1)'s pre-backward"),
            hidden=("was issued after", "backward had finished (its reduce-scatter)", "before it computes")),
    Mistake("10.5", "the prefetched unit gathered again at its pre-backward",
            _edit("q105", "work.wait()                    # its bytes", "work.wait(); unit.unshard()  # its bytes"),
            ("was all-gathered 2 times in backward", "wait for the prefetch's work")),
    Mistake("10.5", "the prefetch follows the forward order, not its reverse",
            _edit("q105", "backward = finished[::-1]", "backward = finished"),
            ("its pre-backward found no all-gather of this step to wait for",
             "the reverse of the order in which the forwards finished"), run_fails=True),
    Mistake("10.5", "the post-backward reduce-scatters but never reshards",
            _edit("q105", "        unit.reduce_scatter_grads()\n        unit.reshard()\n",
                  "        unit.reduce_scatter_grads()\n"),
            ("bytes in the units' full flat buffers", "call unit.reshard()")),
]

MISTAKES = _MISTAKES
