"""Checks of lab 6.3: activation_bytes equals the bytes autograd saves, and is arithmetic for a GPT-3-sized block."""
import time
from numbers import Integral

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from helpers.grading.registry import answer, public_check

# --- 6.3 activation_bytes -----------------------------------------------------------------------

class Block(nn.Module):
    """Lab 06's transformer block: pre-LayerNorm, naive attention, MLP with GELU or ReLU (same code as the lab)."""

    def __init__(self, d_model, n_heads, d_ff, activation="gelu"):
        super().__init__()
        self.n_heads, self.activation = n_heads, activation
        self.ln1, self.qkv, self.proj = (nn.LayerNorm(d_model), nn.Linear(d_model, 3 * d_model),
                                         nn.Linear(d_model, d_model))
        self.ln2, self.fc1, self.fc2 = nn.LayerNorm(d_model), nn.Linear(d_model, d_ff), nn.Linear(d_ff, d_model)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = (z.view(b, t, self.n_heads, d // self.n_heads).transpose(1, 2)       # (B, H, T, D/H) each
                   for z in self.qkv(self.ln1(x)).split(d, dim=-1))
        scores = (q @ k.transpose(-2, -1)) * (d // self.n_heads) ** -0.5                 # (B, H, T, T)
        y = scores.softmax(dim=-1) @ v                                                   # (B, H, T, D/H)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, d))
        act = F.gelu if self.activation == "gelu" else F.relu
        return x + self.fc2(act(self.fc1(self.ln2(x))))


def saved_activation_bytes(model, x):
    """Bytes of the tensors autograd saves during model(x), each storage once, parameters excluded; and the output."""
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    storages = {}

    def pack(t):
        storage = t.untyped_storage()
        if storage.data_ptr() not in params:
            storages[storage.data_ptr()] = storage.nbytes()
        return t.detach()

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = model(x)
    return sum(storages.values()), out


def measured_activation_bytes(batch, seq_len, d_model, n_heads, d_ff, n_layers=1, activation="gelu"):
    """What autograd saves in a forward of n_layers fp32 Blocks, on CPU."""
    torch.manual_seed(0)
    model = nn.Sequential(*[Block(d_model, n_heads, d_ff, activation) for _ in range(n_layers)])
    return saved_activation_bytes(model, torch.randn(batch, seq_len, d_model))[0]


def reference_activation_bytes(batch, seq_len, d_model, n_heads, d_ff, n_layers=1, activation="gelu"):
    """The exact count (tests hold it equal to measured_activation_bytes): fp32, per layer and token."""
    b, t = batch, seq_len
    mlp = (2 if activation == "gelu" else 1) * b * t * d_ff  # ReLU's output is fc2's input: one storage
    per_layer = 8 * b * t * d_model + mlp + 4 * b * t + b * n_heads * t * t
    return 4 * n_layers * per_layer


def _activation_hint(got, measured, batch, seq_len, d_model, n_heads, d_ff, n_layers):
    """A hint when the difference is one of the usual omissions (per layer, times the number of layers)."""
    b, t, diff = batch, seq_len, measured - got
    if n_layers > 1 and got * n_layers == measured:
        return "; every layer saves its own activations: multiply by n_layers"
    terms = {
        4 * b * n_heads * t * t: "the attention probabilities softmax saves, (B, H, T, T) per layer",
        4 * 4 * b * t: "LayerNorm's saved mean and rstd, (B, T, 1) each, two LayerNorms per layer",
        4 * 2 * b * t: "the mean and rstd of one of the two LayerNorms",
        4 * 3 * b * t * d_model: "the contiguous copies of q, k and v the attention products save, (B*H, T, D/H) each",
        4 * b * t * d_ff: ("one (B, T, F) tensor of the MLP: GELU saves its input and fc2 saves GELU's output (two "
                           "storages); ReLU saves its output, which is fc2's input (one storage)"),
        4 * b * t * d_model: "one (B, T, D) tensor, e.g. a LayerNorm's input or a Linear's input",
    }
    for size, what in terms.items():
        for sign, verb, fix in ((1, "missing", "add it"), (-1, "counted once too often", "count it once")):
            if diff == sign * n_layers * size:
                return f"; the difference is {verb}: {what}; {fix}"
    return "; list what each operation saves with saved_activation_bytes on a Block, and compare term by term"


def _compare_6_3(fn, measured, batch, seq_len, d_model, n_heads, d_ff, n_layers=1, activation="gelu",
                 source="autograd saves"):
    kwargs = {}
    if n_layers != 1:
        kwargs["n_layers"] = n_layers
    if activation != "gelu":
        kwargs["activation"] = activation
    call = f"activation_bytes({batch}, {seq_len}, {d_model}, {n_heads}, {d_ff}" + "".join(
        f", {k}={v!r}" for k, v in kwargs.items()) + ")"
    got = fn(batch, seq_len, d_model, n_heads, d_ff, **kwargs)
    assert isinstance(got, Integral) and not isinstance(got, bool), (
        f"{call} returned {got!r} ({type(got).__name__}); return an int (bytes)")
    if got != measured:
        hint = _activation_hint(int(got), measured, batch, seq_len, d_model, n_heads, d_ff, n_layers)
        raise AssertionError(f"{call} = {int(got)} bytes; {source} {measured} bytes{hint}")


SMALL_SHAPES = [(2, 5, 12, 3, 20), (1, 1, 8, 1, 8), (3, 7, 16, 4, 24), (2, 16, 32, 2, 64)]
LAYER_SHAPES = [((2, 6, 12, 3, 20), 3, "relu"), ((1, 9, 8, 2, 16), 2, "gelu"), ((3, 4, 16, 4, 8), 1, "relu")]


@public_check("6.3")
def one_block_matches_saved_tensors(ns):
    """One GELU block, shapes the lab does not show; compared with the bytes autograd saves."""
    fn = answer(ns, "activation_bytes")
    for shape in SMALL_SHAPES:
        _compare_6_3(fn, measured_activation_bytes(*shape), *shape)


@public_check("6.3")
def relu_and_stacked_layers(ns):
    fn = answer(ns, "activation_bytes")
    for shape, n_layers, activation in LAYER_SHAPES:
        _compare_6_3(fn, measured_activation_bytes(*shape, n_layers, activation), *shape, n_layers, activation)


class _NoTorch(TorchFunctionMode):
    """Fails any torch call (tensor creation included) made while it is active."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        raise AssertionError(f"activation_bytes called {getattr(func, '__name__', func)} on a GPT-3-sized block: "
                             "compute the bytes with arithmetic (ints), do not build or measure the model")


@public_check("6.3")
def gpt3_sized_block_is_arithmetic(ns):
    """96 layers of d_model 12288, 96 heads, T = 2048: far too big to build here; the count must still be exact."""
    fn = answer(ns, "activation_bytes")
    shape = (1, 2048, 12288, 96, 4 * 12288)
    start = time.perf_counter()
    with _NoTorch():
        got = fn(*shape, n_layers=96)
    assert time.perf_counter() - start < 1.0, "activation_bytes took over a second: it should be a formula"
    _compare_6_3(lambda *a, **k: got, reference_activation_bytes(*shape, 96), *shape, n_layers=96,
                 source="the exact count (the formula the small blocks' measurements obey) is")
