"""The device guard: on a CPU machine, fail a collective that would get a CPU tensor on a GPU machine.

On a GPU machine rank_device() is the rank's GPU, and a tensor made without device= stays in host
memory: NCCL refuses it. On a CPU machine both are the CPU, so such a mistake is invisible. The guard
makes it visible, in the ranks of `helpers.launch`, when the kernel sets DP_COURSE_DEVICE_GUARD:

    DP_COURSE_DEVICE_GUARD   rank_device() returns       a collective fails when one of its tensors ...
    "pretend" (CPU machine)  SENTINEL = cpu:0            ... was made in host memory (below)
    "check"   (any machine)  the real device             ... has tensor.device != rank_device()
On a machine with GPUs use "check": the real devices tell. Under "pretend", tensors live on the CPU and
carry real values (every assert of a cell still runs); a TorchFunctionMode follows where each tensor
would live on a GPU machine, by the rules CUDA follows:
    made by a factory (randn, zeros, tensor, nn.Linear's empty, ...) without device=rank_device() -> host
    shipped to the rank (launch's args and kwargs)                                               -> host
    .to(rank_device()) of a host tensor -> a new tensor on the device (the old one stays host); .cpu() -> host
    any other op -> host when every tensor input is host (p.grad follows p; param.data = x follows x)
    made by torch.distributed's own code (object collectives, DTensor) -> where torch put it: trusted
    made by DDP's own code (Join's flags: device=self.device, its module's) -> trusted: the module was checked
    .to("cpu") issued by torch.distributed's own code (FSDP1's device_id) -> keeps the tensor's own mark
Also DistributedDataParallel refuses a module with host parameters (its C++ buckets are not followed).

Cannot catch: tensors made in C++ outside these rules (trusted), globals a rank function captures from
the notebook (not followed), CPU-only code in the kernel rather than in a rank (nn.DataParallel), a
"cpu" DeviceMesh (its tensors are followed, its device string is not), and code that compares
`t.device == rank_device()` (cpu != cpu:0 under "pretend"). Those are found by `scan_source`, which
reads cells for GPU-only APIs without a guard and for literal CPU devices. Judged host though right on a
GPU: a factory given device=t.device (under "pretend" every t.device is the CPU); t.new_empty(...) and
t.new_zeros(...) make the same tensor and are followed. Diagnostic tool: it patches
nn.Parameter.__new__ and DDP's constructor in the rank process while it runs, and says so here.
"""
import ast
import os

import torch
import torch.nn as nn
from torch.overrides import TorchFunctionMode

ENV = "DP_COURSE_DEVICE_GUARD"
MODES = ("", "pretend", "check")
SENTINEL = torch.device("cpu", 0)  # what rank_device() returns under "pretend"; tensor.device stays "cpu"
_HOST = "_dp_course_host"  # attribute on a tensor that would live in host memory on a GPU machine
_TORCH_DISTRIBUTED = os.path.join(os.path.dirname(torch.__file__), "distributed") + os.sep
# DistributedDataParallel makes small tensors with device=self.device, the device of its module's parameters (under
# Join: torch.ones(1, device=self.device), all-reduced every step). Under "pretend" that device is the CPU, so they
# would be judged host; on a GPU machine they are on the GPU, and DDP's constructor has checked the module already.
_DDP_FILE = os.path.join(os.path.dirname(torch.__file__), "nn", "parallel", "distributed.py")
FACTORIES = {"randn", "rand", "randint", "randperm", "zeros", "ones", "empty", "full", "arange", "linspace",
             "logspace", "eye", "tensor", "as_tensor", "from_numpy", "frombuffer", "empty_strided", "normal",
             "scalar_tensor", "zeros_like", "ones_like", "empty_like", "full_like", "rand_like", "randn_like",
             "randint_like"}

_mode = ""
# Tensor properties reach a TorchFunctionMode as method-wrappers, new objects each time: compare with ==.
_DATA_SET, _GRAD_GET, _GRAD_SET = torch.Tensor.data.__set__, torch.Tensor.grad.__get__, torch.Tensor.grad.__set__


class DeviceGuardError(RuntimeError):
    """A collective got a tensor that would not be on rank_device() on a GPU machine."""


def mode_from_env():
    """The mode the kernel asks for (read in the kernel: the forkserver's environment is older)."""
    mode = os.environ.get(ENV, "")
    if mode not in MODES:
        raise ValueError(f"{ENV}={mode!r} is not one of {MODES}; use 'pretend' on a CPU machine, "
                         "'check' on a GPU machine, or unset it")
    return mode


def pretending():
    """Whether rank_device() should return SENTINEL in this process."""
    return _mode == "pretend"


def is_host(t):
    """Whether the guard judges that tensor t would be in host memory on a GPU machine."""
    return bool(getattr(t, _HOST, False))


def _mark(tensors, host):
    for t in tensors:
        if isinstance(t, torch.Tensor):
            setattr(t, _HOST, host)


# Leaves that hold no tensor, and the tensor types that are leaves: _flat sorts them without torch's pytree,
# which it asks only about the containers it flattens (torch.utils._pytree: a leaf is any type not registered).
_ATOMS = frozenset({int, float, bool, complex, str, type(None), torch.dtype, torch.device, torch.layout,
                    torch.memory_format, torch.Size, slice, type(Ellipsis)})
_TENSORS = frozenset({torch.Tensor, nn.Parameter})
_MOVES = (torch.Tensor.to, torch.Tensor.cpu, torch.Tensor.cuda)


def _flat(x):
    """The tensors among the leaves of x, as torch.utils._pytree.tree_leaves finds them."""
    found = []
    _collect((x,), found)
    return found


def _collect(items, found):
    # Placement flattens every op's inputs and outputs, so plain containers (whose pytree flattening is
    # iteration), tensors and atoms are sorted here, and pytree sees only the other containers: chapter 05's
    # learning-rate runs took 2.7x their CPU time under the guard with tree_leaves for everything, 1.7x with this.
    for x in items:
        kind = type(x)
        if kind in _TENSORS:
            found.append(x)
        elif kind is tuple or kind is list:
            _collect(x, found)
        elif kind is dict:
            _collect(x.values(), found)
        elif kind in _ATOMS:
            continue
        elif kind in torch.utils._pytree.SUPPORTED_NODES or isinstance(x, tuple):  # namedtuples, return_types
            found.extend(t for t in torch.utils._pytree.tree_leaves(x) if isinstance(t, torch.Tensor))
        elif isinstance(x, torch.Tensor):   # a tensor subclass (DTensor); other leaves hold no tensor
            found.append(x)


class Placement(TorchFunctionMode):
    """Follow, tensor by tensor, whether it would be in host memory on a GPU machine (module docstring)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in _MOVES:
            return self._move(func, args, kwargs)
        out = func(*args, **kwargs)
        name = getattr(func, "__name__", "")
        if func == _DATA_SET or func == _GRAD_SET:
            _mark([args[0]], is_host(args[1]))
        elif func == _GRAD_GET and out is not None:
            _mark([out], is_host(args[0]))
        elif name in FACTORIES:
            self._made(name, args, kwargs, out)
        else:
            inputs = []
            _collect(args, inputs)
            if kwargs:
                _collect(kwargs.values(), inputs)
            host = bool(inputs)
            for t in inputs:
                if not getattr(t, _HOST, False):
                    host = False
                    break
            given = {id(t) for t in inputs}
            for t in [out] if type(out) in _TENSORS else _flat(out):
                if id(t) not in given:  # in-place results keep theirs
                    setattr(t, _HOST, host)
        return out

    @staticmethod
    def _made(name, args, kwargs, out):
        if _called_from_torch_distributed() or _called_from_ddp():
            return  # torch.distributed or DDP chose the device itself (object collectives, DTensor, Join): trusted
        device = kwargs.get("device")
        if device is None and name.endswith("_like"):
            _mark(_flat(out), is_host(args[0]))
            return
        _mark(_flat(out), device is None or torch.device(device) != SENTINEL)

    @staticmethod
    def _move(func, args, kwargs):
        t = args[0]
        if func is torch.Tensor.cpu:
            target_host = True
        elif func is torch.Tensor.cuda:
            target_host = False
        elif args[1:] and isinstance(args[1], torch.Tensor):
            target_host = is_host(args[1])
        else:
            # _parse_to refuses copy= (".to() does not accept copy argument"), which Tensor.to takes: GradScaler
            # replicates its scale with .to(device=..., non_blocking=True, copy=True).
            device = torch._C._nn._parse_to(*args[1:], **{k: v for k, v in kwargs.items() if k != "copy"})[0]
            target_host = is_host(t) if device is None else torch.device(device) != SENTINEL
            if target_host and _called_from_torch_distributed():
                # FSDP1 moves the module to its device_id: the rank's GPU on a GPU machine, "cpu" here (FSDP1
                # refuses cpu:0). Where the tensor would live was decided by the rank's code: it keeps its mark.
                target_host = is_host(t)
        if target_host == is_host(t):
            out = func(*args, **kwargs)
        else:  # a GPU machine copies across devices; so do we, and the source keeps its own mark
            out = torch.Tensor.to(t, *args[1:], **{**kwargs, "copy": True}) if func is torch.Tensor.to \
                else t.clone()
        _mark([out], target_host)
        return out


def _called_from_torch_distributed():
    """Whether the call that reached Placement (two frames up from its helper) is torch.distributed's own code."""
    import sys

    return sys._getframe(3).f_code.co_filename.startswith(_TORCH_DISTRIBUTED)


def _called_from_ddp():
    """Whether the call that reached Placement (two frames up from its helper) is DistributedDataParallel's code."""
    import sys

    return sys._getframe(3).f_code.co_filename == _DDP_FILE


def _object_collective():
    """Whether torch.distributed's object collectives issue this call: they choose their device themselves."""
    import sys

    frame = sys._getframe(2)
    while frame is not None:
        if frame.f_code.co_filename.startswith(_TORCH_DISTRIBUTED) and "_object" in frame.f_code.co_name:
            return True
        frame = frame.f_back
    return False


def check_collective(record, tensors, args):
    """Raise DeviceGuardError when one of a collective's tensors is not where rank_device() says."""
    from helpers.backend import rank_device

    op, call_site = record.op, record.call_site

    if _object_collective():
        return
    expected = rank_device()
    for t in tensors:
        wrong = is_host(t) if _mode == "pretend" else t.device != expected
        if wrong:
            where = "made in host memory (the CPU)" if _mode == "pretend" else f"on {t.device}"
            rank = torch.distributed.get_rank() if torch.distributed.is_initialized() else 0
            site = f" at {call_site}" if call_site else " (issued by PyTorch)"
            raise DeviceGuardError(
                f"rank {rank}: {op}{site} got a {tuple(t.shape)} {str(t.dtype).removeprefix('torch.')} tensor "
                f"{where}, which NCCL refuses on a GPU machine; create it with device=rank_device() "
                f"or move it with .to(rank_device()) (the model too: model.to(rank_device()))")


def _checked_ddp_init(original):
    def __init__(self, module, *args, **kwargs):
        host = [n for n, p in module.named_parameters() if is_host(p)]
        if host:
            raise DeviceGuardError(
                f"DistributedDataParallel got a module whose parameters are in host memory ({host[0]}, ...); "
                f"NCCL refuses them on a GPU machine: pass model.to(rank_device())")
        original(self, module, *args, **kwargs)
    return __init__


class Guard:
    """The guard in one rank, for the duration of the rank function (`with Guard(mode, args):`)."""

    def __init__(self, mode, shipped=()):
        self.mode = mode
        self.shipped = shipped
        self._undo = []

    def __enter__(self):
        global _mode
        from helpers.comm import CommLedger

        _mode = self.mode
        # Checks only: a ledger that kept every collective's record would grow for the whole rank function,
        # and stamp each one's end from a callback on the backend's thread (2x a Gloo all-reduce's CPU, measured).
        self.ledger = CommLedger(check=check_collective, keep_records=False).__enter__()
        if self.mode == "pretend":
            _mark(_flat(self.shipped), True)
            for m in (x for x in torch.utils._pytree.tree_leaves(self.shipped) if isinstance(x, nn.Module)):
                _mark(list(m.parameters()) + list(m.buffers()), True)
            self._patch(nn.Parameter, "__new__", _parameter_new(nn.Parameter.__new__))
            ddp = torch.nn.parallel.DistributedDataParallel
            self._patch(ddp, "__init__", _checked_ddp_init(ddp.__init__))
            self.placement = Placement().__enter__()
        return self

    def _patch(self, owner, name, value):
        self._undo.append((owner, name, owner.__dict__[name]))
        setattr(owner, name, value)

    def __exit__(self, *exc):
        global _mode
        if self.mode == "pretend":
            self.placement.__exit__(*exc)
        for owner, name, value in reversed(self._undo):
            setattr(owner, name, value)
        self.ledger.__exit__(*exc)
        _mode = ""
        return False


def _parameter_new(original):
    def __new__(cls, data=None, requires_grad=True):
        p = original(cls, data, requires_grad)
        if data is not None:
            _mark([p], is_host(data))
        return p
    return staticmethod(__new__)


# --- the static half: what the runtime guard cannot see, read from a cell's source ---------------------

_GPU_ONLY = ("DataParallel", "max_memory_allocated", "reset_peak_memory_stats", "synchronize", "Event",
             "Stream", "current_stream", "set_device", "cuda")
# What counts as a guard in the same cell: a test of the machine or of the tensor, not a mere mention.
_GUARDS = ("cuda.is_available()", ".is_cuda", "uses_nccl(", "device_count() >", "device_count() <", "device_count() ==")


def scan_source(source):
    """[(line, what is wrong)] in one cell: GPU-only APIs without a guard, literal CPU devices and meshes."""
    try:
        tree = ast.parse(source)
    except SyntaxError:  # IPython magics: scan the cell without its %-lines
        tree = ast.parse("\n".join("" if ln.lstrip().startswith(("%", "!")) else ln for ln in source.splitlines()))
    guarded = any(g in source for g in _GUARDS)
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
        text = ast.unparse(node.func)
        if name == "init_device_mesh" and node.args and isinstance(node.args[0], ast.Constant):
            found.append((node.lineno, f"init_device_mesh({node.args[0].value!r}, ...): "
                                       "pass rank_device().type"))
        elif name in _GPU_ONLY and ("cuda" in text or name == "DataParallel") and not guarded:
            found.append((node.lineno, f"{text}(...) needs a GPU: guard it with torch.cuda.is_available() "
                                       "and say what the CPU run shows instead"))
        for kw in node.keywords:
            if kw.arg == "device" and isinstance(kw.value, ast.Constant) and kw.value.value == "cpu":
                found.append((node.lineno, f"{text}(device='cpu'): pass device=rank_device()"))
    return found
