"""Lab 04 (bucketing and overlap): chapter 04's first versions, the picotron hook bug and the slips of a DDP-shaped
wrapper (4.5), held to their first line.

The wrong answers are the ones tests/test_lab04_checks.py already holds.
"""
from helpers.grading.prepare.labgen import ROOT
from tests import test_lab04_checks as wrong
from tests.mistakes import Mistake

SOLUTION = ROOT / "solutions" / "04_bucketing_and_overlap.ipynb"

MISTAKES = [
    Mistake("4.1", "buckets from the first parameter (forward order)", wrong.FORWARD_ORDER,
            ("grouped from the FIRST parameter",)),
    Mistake("4.1", "counts elements, not bytes", wrong.COUNTS_ELEMENTS, ("counted elements, not bytes",)),
    Mistake("4.1", "keeps every bucket under the cap", wrong.STAYS_UNDER_CAP,
            ("torch closes a bucket at the first tensor",)),
    Mistake("4.2", "copies the parameter, not its gradient (picotron)", wrong.AVERAGES_PARAMETERS,
            ("the average of the PARAMETERS",)),
    Mistake("4.2", "never waits on the work handle", wrong.NO_WAIT, ("wait() on the work handle",)),
    Mistake("4.2", "one all-reduce per parameter", wrong.PER_PARAMETER, ("not one per parameter",)),
    Mistake("4.2", "waits inside add_grad: no overlap", wrong.WAITS_IN_ADD_GRAD, ("so it waited for the all-reduce",)),
    Mistake("4.2", "never resets pending", wrong.NO_RESET, ("reset pending",)),
    Mistake("4.3", "hook all-reduces the parameter", wrong.HOOK_AVERAGES_PARAMETERS, ("instead of `param.grad`",)),
    Mistake("4.3", "buckets reduced in finalize, after backward", wrong.ALL_REDUCE_IN_FINALIZE,
            ("launch each bucket from the gradient hooks",)),
    Mistake("4.3", "one async all-reduce per parameter", wrong.PER_PARAMETER_HOOKS,
            ("8 all-reduces in one step, expected 3",)),
    Mistake("4.3", "finalize copies back without waiting", wrong.FINALIZE_WITHOUT_WAIT,
            ("wait() on the work handle",)),
    Mistake("4.4", "optimizer.step() before finalize()", wrong.STEP_BEFORE_FINALIZE,
            ("finalize() BEFORE optimizer.step()",)),
    Mistake("4.4", "a new Reducer every step", wrong.REDUCER_PER_STEP, ("Build ONE Reducer before the loop",)),
    Mistake("4.5", "finish_gradient_synchronization does nothing", wrong.FINISH_DOES_NOTHING,
            ("finish_gradient_synchronization() must finish every bucket", "finalize()")),
    Mistake("4.5", "forward never refuses an unsynchronized step", wrong.NO_REFUSAL,
            ("the second forward ran", "Raise RuntimeError")),
    Mistake("4.5", "a Reducer built in forward", wrong.REDUCER_IN_FORWARD, ("build the Reducer", "ONCE, in __init__")),
    Mistake("4.5", "the model kept as .model, not .module", wrong.KEPT_AS_MODEL,
            ("keep the wrapped model as self.module",)),
    Mistake("4.5", "nn.Module.__init__ never called", wrong.NO_MODULE_INIT,
            ("cannot assign module before Module.__init__() call",)),
]
