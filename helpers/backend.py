"""Which process-group backend a launch uses: NCCL with one GPU per rank, Gloo otherwise."""
import torch

from helpers.errors import LaunchError

BACKENDS = ("auto", "gloo", "nccl")


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


def rank_device():
    """The device this rank computes on: its own GPU under NCCL, the CPU under Gloo."""
    import torch.distributed as dist

    if dist.is_initialized() and dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")
