"""Bytes of model state held by this process (params, grads, optimizer state) and peak process memory.

Counting rule of `state_bytes`: every tensor is reduced to the storage that really holds its bytes, and
each storage is counted once, whole, in the first category that reaches it (params, then grads, then
optimizer). So tied weights count once; gradients that are views into DDP's buckets
(gradient_as_bucket_view) or parameters that are views into one flat buffer (FSDP1, a hand-written
ZeRO-3) count the buffer once; and a view into a bigger storage counts the whole storage, because the
view keeps all of it alive. A DTensor (FSDP2, tensor parallel) counts its local shard only; storages
resized to 0 bytes (FSDP frees unsharded parameters that way) and meta tensors count 0.
Only what is reachable from the model's parameters, their .grad and the optimizer counts: buffers,
activations and DDP's private bucket copies do not; `peak_memory` sees those.
"""
import contextlib
import dataclasses
import os
import re
import threading
import time
from collections.abc import Iterable, Iterator, Mapping

import torch

# Sampling period of the fallback RSS sampler: short next to the time it takes to touch a large tensor.
_SAMPLE_PERIOD_S = 0.002


def local_tensor(t: torch.Tensor) -> torch.Tensor:
    """The part of `t` this process holds: a DTensor's local shard, any other tensor itself."""
    if not torch.distributed.is_available():  # a torch build without distributed has no DTensor
        return t
    from torch.distributed.tensor import (
        DTensor,  # lazy: keeps `import helpers.memory` cheap
    )

    if isinstance(t, DTensor):
        with torch.no_grad():  # a plain view of the shard, no autograd node
            return t.to_local()
    return t


def _storage_key_and_bytes(t: torch.Tensor) -> tuple[tuple, int]:
    """(device, address) of the storage behind `t` and its allocated bytes; 0 bytes for meta tensors."""
    t = local_tensor(t)
    if t.is_meta:
        return ("meta", id(t)), 0
    storage = t.untyped_storage()
    return (str(storage.device), storage.data_ptr()), storage.nbytes()


def _tensors_in(obj) -> Iterator[torch.Tensor]:
    """Every tensor inside nested dicts, lists and tuples (the shape of optimizer state)."""
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, Mapping):
        for value in obj.values():
            yield from _tensors_in(value)
    elif isinstance(obj, (list, tuple)):
        for value in obj:
            yield from _tensors_in(value)


def _optimizers(optimizer) -> list:
    """The optimizer, plus ZeroRedundancyOptimizer's local optimizer, which holds this rank's shard."""
    local = getattr(optimizer, "optim", None)
    return [optimizer] + ([local] if isinstance(local, torch.optim.Optimizer) else [])


def _sources(model, optimizer, extra) -> dict[str, list[torch.Tensor]]:
    """The tensors behind each category, in counting order: params, grads, optimizer, then extra ones."""
    params = list(model.parameters()) if model is not None else []
    sources = {"params": params, "grads": [p.grad for p in params if p.grad is not None], "optimizer": []}
    if optimizer is not None:
        optimizers = _optimizers(optimizer)
        # Its parameters are the model's (counted already) or master copies it keeps (optimizer state);
        # their .grad is where a hand-written ZeRO-2 keeps its gradient shard.
        opt_params = [p for o in optimizers for group in o.param_groups for p in group["params"]]
        sources["grads"] += [p.grad for p in opt_params if p.grad is not None]
        sources["optimizer"] = opt_params + [t for o in optimizers for t in _tensors_in(dict(o.state))]
    # extra: shards the walk cannot reach, e.g. {"optimizer": [exp_avg_shard, ...]}, or new categories
    for category, tensors in (extra or {}).items():
        if category == "total":
            raise ValueError("state_bytes: extra cannot use the category 'total', it is computed")
        sources[category] = sources.get(category, []) + list(tensors)
    return sources


def state_bytes(model: torch.nn.Module | None, optimizer=None, *,
                extra: Mapping[str, Iterable[torch.Tensor]] | None = None) -> dict[str, int]:
    """Bytes of params, grads, optimizer state (and `total`) held by this process, each storage once."""
    seen, counts = set(), {}
    for category, tensors in _sources(model, optimizer, extra).items():
        counts[category] = 0
        for t in tensors:
            key, nbytes = _storage_key_and_bytes(t)
            if nbytes and key not in seen:
                seen.add(key)
                counts[category] += nbytes
    counts["total"] = sum(counts.values())
    return counts


@dataclasses.dataclass
class PeakMemory:
    """Memory around a block, in bytes; filled in when the `peak_memory` block exits."""
    method: str = ""
    start_bytes: int = 0
    peak_bytes: int = 0
    delta_bytes: int = 0


def choose_method(device_type: str, hwm_resettable: bool, can_sample: bool) -> str:
    """How to measure a peak: 'cuda' allocator stats, 'vmhwm' (Linux, resettable), else 'sampler'."""
    if device_type == "cuda":
        return "cuda"
    if hwm_resettable:
        return "vmhwm"
    if can_sample:
        return "sampler"
    raise RuntimeError("peak_memory: no way to read this process's memory here "
                       "(no /proc/self/status and no psutil); install psutil")


def _proc_status_bytes(field: str) -> int:
    """A VmXXX field of /proc/self/status, in bytes."""
    with open("/proc/self/status") as f:
        kib = re.search(rf"^{field}:\s+(\d+) kB", f.read(), re.M).group(1)
    return int(kib) * 1024


def _reset_hwm() -> bool:
    """Reset Linux's peak-RSS mark (VmHWM) to the current RSS; False where the kernel refuses."""
    # ru_maxrss is a lifetime high-water mark; writing "5" to clear_refs resets VmHWM (Linux >= 4.0).
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        # A kernel may accept the write and ignore it: trust it only if the mark came down.
        return _proc_status_bytes("VmHWM") <= _proc_status_bytes("VmRSS") + (1 << 20)
    except (OSError, AttributeError):
        return False


def _rss_reader():
    """A function returning current RSS in bytes, or None if this platform offers none."""
    if os.path.exists("/proc/self/status"):
        return lambda: _proc_status_bytes("VmRSS")
    try:
        import psutil  # macOS and Windows; installed with ipykernel
    except ImportError:
        return None
    process = psutil.Process()
    return lambda: process.memory_info().rss


class _Sampler(threading.Thread):
    """Reads RSS every few ms and keeps the maximum: a peak for platforms that cannot reset one."""

    def __init__(self, read):
        super().__init__(daemon=True)
        self.read, self.peak, self.done = read, read(), threading.Event()

    def run(self):
        while not self.done.is_set():
            self.peak = max(self.peak, self.read())
            time.sleep(_SAMPLE_PERIOD_S)

    def stop(self) -> int:
        self.done.set()
        self.join()
        return max(self.peak, self.read())


@contextlib.contextmanager
def peak_memory(device: torch.device | str = "cpu", *, method: str | None = None):
    """Measure peak memory during the block: process RSS on CPU, allocated tensor bytes on CUDA."""
    device, read = torch.device(device), _rss_reader()
    if method is None:
        resettable = device.type != "cuda" and os.path.exists("/proc/self/clear_refs") and _reset_hwm()
        method = choose_method(device.type, resettable, read is not None)
    if method not in ("cuda", "vmhwm", "sampler"):
        raise ValueError(f"peak_memory: method {method!r} is not 'cuda', 'vmhwm' or 'sampler'")
    result = PeakMemory(method=method)
    if method == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        result.start_bytes = torch.cuda.memory_allocated(device)
    elif method == "vmhwm":
        _reset_hwm()
        result.start_bytes = _proc_status_bytes("VmRSS")
    else:
        sampler = _Sampler(read)
        result.start_bytes = sampler.peak
        sampler.start()
    try:
        yield result
    finally:
        if method == "cuda":
            torch.cuda.synchronize(device)
            result.peak_bytes = torch.cuda.max_memory_allocated(device)
        elif method == "vmhwm":
            result.peak_bytes = _proc_status_bytes("VmHWM")
        else:
            result.peak_bytes = sampler.stop()
        result.delta_bytes = result.peak_bytes - result.start_bytes
