"""Which process-group backend a launch uses: NCCL with one GPU per rank, Gloo otherwise.

    choice (launch's backend=)   process group the ranks join            rank_device()
    "gloo"                       "gloo"                                   cpu
    "nccl"                       "cpu:gloo,cuda:nccl" (device-mapped)     cuda:<rank>
    "auto"                       "nccl" when gpus >= world_size, else "gloo"

With the device-mapped group, CUDA tensors go over NCCL and CPU tensors over Gloo, so a cell that keeps
a small CPU tensor (a seed, a count) still runs on a GPU machine; the lesson's tensors go on rank_device().
"""
import torch

from helpers.errors import LaunchError

BACKENDS = ("auto", "gloo", "nccl")

# The form torch 2.13 accepts: torch/distributed/distributed_c10d.py, BackendConfig.__init__ parses
# "<device_type>:<backend>,<device_type>:<backend>" (the example in its error message is this very
# string), and init_process_group's docstring note "Support for multiple backends is experimental"
# gives "cpu:gloo,cuda:custom_backend". dist.get_backend() then returns the whole string.
DEVICE_MAPPED_NCCL = "cpu:gloo,cuda:nccl"


def gpu_count():
    """CUDA devices this process can see (0 on a CPU-only build)."""
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def select_backend(requested, world_size, gpus):
    """Resolve "auto" and check that "nccl" has one GPU per rank."""
    if requested not in BACKENDS:
        raise ValueError(f"backend={requested!r} is not one of {BACKENDS}; "
                         "use 'auto' to get NCCL on GPUs and Gloo on CPU")
    if requested == "auto":
        return "nccl" if gpus >= world_size else "gloo"
    if requested == "nccl" and gpus < world_size:
        fewer = f", or lower world_size to {gpus}" if gpus else ""
        raise LaunchError(
            f"backend='nccl' needs one GPU per rank: world_size={world_size} but {gpus} CUDA GPU(s) "
            f"were found. Use backend='gloo' (runs on CPU) or 'auto'{fewer}.")
    return requested


def process_group_backend(choice):
    """The backend string init_process_group gets for a resolved choice ("gloo" or "nccl")."""
    return DEVICE_MAPPED_NCCL if choice == "nccl" else choice


def uses_nccl(backend):
    """Whether a process group's backend string ("nccl", "cpu:gloo,cuda:nccl", "gloo") sends CUDA tensors by NCCL."""
    return any(part.split(":")[-1] == "nccl" for part in str(backend).split(","))


def rank_device():
    """The device this rank computes on: its own GPU under NCCL, the CPU under Gloo."""
    import torch.distributed as dist

    from helpers.launcher import (
        device_guard,  # the CPU-side check of the NCCL path, off unless asked for
    )

    if device_guard.pretending():
        return device_guard.SENTINEL
    if dist.is_initialized() and uses_nccl(dist.get_backend()):
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")
