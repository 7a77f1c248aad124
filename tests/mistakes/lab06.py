"""Lab 06 (memory anatomy): the popular wrong tables and the usual slips, held to their first line.

Most wrong answers are the ones tests/test_lab06_checks.py already holds; here each first line must name the
mistake and its fix.
"""
from helpers.grading.prepare.labgen import ROOT
from tests import test_lab06_checks as wrong
from tests.mistakes import Mistake

SOLUTION = ROOT / "solutions" / "06_memory_anatomy.ipynb"

# (mistake's name in test_lab06_checks) -> the first line's fragments: the mistake, then the fix
FIRST_LINES = {
    "6.1 ZeRO-2 drops the gradients (the 210 GB table)": ("'210 GB' error", "stage 2 keeps the grads"),
    "6.1 hard-coded 2 + 2 + 12": ("default 2 + 2 + 12 answer", "use param_bytes, grad_bytes and optimizer_bytes"),
    "6.1 each stage shards only its own category": ("stage 2 shards the optimizer", "bytes / world_size"),
    "6.2 ignores reserved_bytes": ("not available for model states", "subtract reserved_bytes"),
    "6.3 no attention probabilities": ("missing: the attention probabilities", "add it"),
    "6.3 ReLU's output counted twice": ("counted once too often", "count it once"),
    "6.3 builds and measures the model": ("do not build or measure the model", "compute the bytes with arithmetic"),
    "no DDP: each rank trains alone": ("differ from rank 0's", "wrap the model in DistributedDataParallel"),
    "zero_grad after the step: no gradients held": ("no gradients held at the end",
                                                    "zero them at the start of each step"),
}

MISTAKES = [Mistake(question, name, override, FIRST_LINES[name])
            for name, (question, override, _) in wrong.WRONG.items()]
MISTAKES += [Mistake("6.4", name, override, FIRST_LINES[name]) for name, (override, _) in wrong.WRONG_6_4.items()]

_LARGEST = '''
def largest_model(memory_bytes, world_size, stage, *, reserved_bytes=0, param_bytes=2, grad_bytes=2,
                  optimizer_bytes=12):
    per_param = model_state_bytes(1, world_size, stage{convention})["total"]
    {body}
'''
_ACTIVATIONS = '''
def activation_bytes(batch, seq_len, d_model, n_heads, d_ff, *, n_layers=1, activation="gelu"):
    b, t, d, h, f = batch, seq_len, d_model, n_heads, d_ff
    layer_norms = 2 * (b * t * d + {stats})
    attention = b * t * d + 3 * b * t * d + b * h * t * t + b * t * d
    mlp = b * t * d + (2 if activation == "gelu" else 1) * b * t * f
    return 4 * {layers} * (layer_norms + attention + mlp)
'''
_CONVENTION = ", param_bytes=param_bytes, grad_bytes=grad_bytes, optimizer_bytes=optimizer_bytes"

MISTAKES += [
    Mistake("6.1", "ZeRO-3 forgets to shard the parameters", wrong.STAGES.format(**{**wrong.RIGHT, "PS": "> 3"}),
            ("stage 3 shards the params", "bytes / world_size")),
    Mistake("6.1", "no check of stage and world_size", wrong.STAGES.format(**wrong.RIGHT).replace(
        "    if stage not in (0, 1, 2, 3) or world_size < 1:\n        raise ValueError(stage)\n", ""),
            ("should raise ValueError", "stages are 0, 1, 2, 3 and world_size >= 1")),
    Mistake("6.2", "a float, not a whole number of parameters", _LARGEST.format(
        convention=_CONVENTION, body="return max(0.0, (memory_bytes - reserved_bytes) / per_param)"),
            ("(float)", "return an int")),
    Mistake("6.2", "a negative count when the reserve takes everything", _LARGEST.format(
        convention=_CONVENTION, body="return math.floor((memory_bytes - reserved_bytes) / per_param)"),
            ("nothing fits", "return 0")),
    Mistake("6.2", "the convention not passed on to model_state_bytes", _LARGEST.format(
        convention="", body="return max(0, math.floor((memory_bytes - reserved_bytes) / per_param))"),
            ("default 2 + 2 + 12 bytes", "pass param_bytes, grad_bytes and optimizer_bytes on")),
    Mistake("6.3", "one layer only (n_layers ignored)", _ACTIVATIONS.format(stats="2 * b * t", layers="1"),
            ("every layer saves its own activations", "multiply by n_layers")),
    Mistake("6.3", "LayerNorm's mean and rstd left out", _ACTIVATIONS.format(stats="0", layers="n_layers"),
            ("missing: LayerNorm's saved mean and rstd", "add it")),
]
