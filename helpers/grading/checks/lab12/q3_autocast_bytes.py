"""Checks of lab 12.3: autocast_bytes, what one forward keeps under bf16 autocast against fp32, to the byte.

The model is a 3-layer MLP, Linear(D, F), GELU, Linear(F, F), GELU, Linear(F, D), on an input of B rows that needs no
gradient. The formulas (chapter 06, section 8: each Linear saves its input, each GELU its input; chapter 12,
section 6: autocast casts every parameter once per forward, and autograd keeps the weight copies that backward needs):
    params        4 psi, under autocast too (the model stays fp32)
    casts         2 psi under bf16 autocast, 0 in fp32
    saved copies  2 (F F + F D) under bf16 autocast: the weights of every Linear but the first, whose input needs no
                  gradient; 0 in fp32
    activations   b B (D + 4 F): b = 4 bytes in fp32, 2 under bf16 autocast, exactly half
Tolerance: none. Every count is a sum of whole storages, so measurement and formula agree to the byte (chapter 06,
section 8 measured its MLP's formula exactly too).
"""
import torch
from torch import nn

from helpers.grading.checks.lab12 import common
from helpers.grading.registry import answer, public_check
from helpers.grading.shared_run import definitions

KEYS = ("params", "casts", "saved copies", "activations")


def sizes():
    """(B, D, F): the check's own, or the hidden test's (OFFSET)."""
    return 6 + common.OFFSET % 5, 8 + 4 * (common.OFFSET // 5 % 3), 12 + 2 * (common.OFFSET // 15 % 4)


def _model_and_input():
    batch, d, f = sizes()
    torch.manual_seed(32 + common.OFFSET)
    model = nn.Sequential(nn.Linear(d, f), nn.GELU(), nn.Linear(f, f), nn.GELU(), nn.Linear(f, d))
    return model, torch.randn(batch, d)


def formulas():
    """{"fp32": {...}, "bf16": {...}}: the bytes each key must hold."""
    batch, d, f = sizes()
    psi = d * f + f + f * f + f + f * d + d
    rows = batch * (d + 4 * f)
    return {"fp32": {"params": 4 * psi, "casts": 0, "saved copies": 0, "activations": 4 * rows},
            "bf16": {"params": 4 * psi, "casts": 2 * psi, "saved copies": 2 * (f * f + f * d),
                     "activations": 2 * rows}}


def runs(fn):
    """The student's counts for one forward in fp32 and under bf16 autocast (what every check of 12.3 reads)."""
    out = {}
    for name, dtype in (("fp32", None), ("bf16", torch.bfloat16)):
        model, x = _model_and_input()
        counts = fn(model, x, dtype)
        out[name] = {k: int(v) for k, v in counts.items()} if isinstance(counts, dict) else counts
    return out


def _results(ns):
    fn = answer(ns, "autocast_bytes")
    return common._memoized("12.3", definitions(ns), lambda: runs(fn))


def _counts(ns, precision):
    got = _results(ns)[precision]
    assert isinstance(got, dict) and set(KEYS) <= set(got), (
        f"autocast_bytes returned {type(got).__name__} {sorted(got) if isinstance(got, dict) else ''}; expected a "
        f"dict with the keys {list(KEYS)}")
    return got


@public_check("12.3")
def parameters_stay_fp32(ns):
    want = formulas()
    for precision in ("fp32", "bf16"):
        got = _counts(ns, precision)["params"]
        if precision == "bf16" and got == want["bf16"]["params"] // 2:
            raise AssertionError("under bf16 autocast you counted 2 bytes per parameter: autocast does not convert "
                                 "the model, the parameters stay fp32 (4 bytes each); the 2-byte copies are 'casts'")
        assert got == want[precision]["params"], (f"{precision}: 'params' is {got} bytes; the model's parameters "
                                                  f"hold {want[precision]['params']} (p.numel() * p.element_size())")


@public_check("12.3")
def one_cast_per_parameter(ns):
    want, (_, d, f) = formulas(), sizes()
    got = _counts(ns, "fp32")["casts"]
    assert got == 0, f"fp32: 'casts' is {got} bytes; without autocast no parameter is copied: 0"
    got, psi = _counts(ns, "bf16")["casts"], want["bf16"]["casts"] // 2
    weights = d * f + f * f + f * d
    why = {4 * psi: "the copies were counted at 4 bytes an element: a bf16 copy holds 2 (its storage's nbytes())",
           2 * weights: "only the weights' copies were counted: autocast casts the biases too (addmm takes the bias)",
           0: "no copy was counted: under autocast every parameter a Linear uses is cast to bf16 (ParamCasts sees "
              "each _to_copy of a parameter)"}.get(got)
    assert got == want["bf16"]["casts"], why or (f"bf16: 'casts' is {got} bytes; autocast makes one bf16 copy of "
                                                 f"each of the {psi} parameters: {want['bf16']['casts']} bytes")


@public_check("12.3")
def weight_copies_saved_for_backward(ns):
    want, (_, d, f) = formulas(), sizes()
    got = _counts(ns, "fp32")["saved copies"]
    assert got == 0, f"fp32: 'saved copies' is {got} bytes; without autocast there are no copies to save: 0"
    got = _counts(ns, "bf16")["saved copies"]
    if got == want["bf16"]["casts"]:
        raise AssertionError("bf16: 'saved copies' counts every cast; count only the saved tensors whose storage is a "
                             "cast's: the biases' copies and the first layer's weight copy are not saved (its input "
                             "needs no gradient)")
    assert got == want["bf16"]["saved copies"], (
        f"bf16: 'saved copies' is {got} bytes; autograd keeps the bf16 weights of the layers whose input needs a "
        f"gradient (Linear 2 and 3): 2 x ({f} x {f} + {f} x {d}) = {want['bf16']['saved copies']} bytes")


@public_check("12.3")
def activations_match_the_formula(ns):
    want, (batch, d, f) = formulas(), sizes()
    weights_after_first = f * f + f * d
    for precision, width in (("fp32", 4), ("bf16", 2)):
        got = _counts(ns, precision)["activations"]
        expected = want[precision]["activations"]
        if got == expected + width * weights_after_first:
            raise AssertionError(
                f"{precision}: the {'parameters' if precision == 'fp32' else 'weight copies'} were counted as "
                "activations: leave out every saved tensor whose storage is a parameter's (saved by reference) or a "
                "cast's ('saved copies')")
        assert got == expected, (
            f"{precision}: 'activations' is {got} bytes; each Linear saves its input and each GELU its input: "
            f"{width} x B x (D + 4 F) = {width} x {batch} x ({d} + 4 x {f}) = {expected} bytes (each storage once)")
