"""Print the pip arguments that install the right torch build for this machine (used by `make setup`).

    $ python scripts/pip_install_args.py
    torch==2.13.0 --extra-index-url https://download.pytorch.org/whl/cpu

| machine                                          | torch from                                      |
|--------------------------------------------------|-------------------------------------------------|
| TORCH_INDEX=<url> set                            | <url>, as an extra index (e.g. .../whl/cu126)   |
| TORCH_INDEX=default set                          | the default index (PyPI, or pip's own config)   |
| Linux, NVIDIA GPU (nvidia-smi runs, or           | the default index: on Linux, PyPI's torch is    |
|   /proc/driver/nvidia exists)                    |   the CUDA build                                |
| Linux, no NVIDIA GPU                             | CPU_INDEX as an extra index                     |
| macOS, Windows                                   | the default index (PyPI's wheels there have no  |
|                                                  |   CUDA libraries to download)                   |

Why an EXTRA index and not --index-url: pip then still sees the default index, `find-links` and its cache,
and among equal versions takes the first it found there, so a local CPU wheel still wins; among the
indexes, `torch==2.13.0` also matches `2.13.0+cpu`, which sorts above `2.13.0` (PEP 440 local versions),
so the CPU build is chosen over PyPI's CUDA build. `make setup` installs torch alone with --no-deps and
these arguments, then the course without them: the extra index is asked about one package, not about
every dependency (an unreachable index costs pip's retries once, not once per package).

The torch pin is read from pyproject.toml, so it lives in one place. Standard library only: this runs
before anything is installed, with any Python from 3.10 on.
"""
import os
import pathlib
import re
import shutil
import subprocess
import sys

CPU_INDEX = "https://download.pytorch.org/whl/cpu"
PYPROJECT = pathlib.Path(__file__).resolve().parent.parent / "pyproject.toml"
NVIDIA_PROC = "/proc/driver/nvidia"  # the NVIDIA kernel driver's directory, present when it is loaded


def torch_requirement(pyproject=PYPROJECT):
    """The exact torch pin from pyproject.toml, e.g. 'torch==2.13.0'."""
    found = re.findall(r'"(torch==[^"]+)"', pathlib.Path(pyproject).read_text())
    if len(found) != 1:
        raise SystemExit(f"{pyproject}: expected one exact torch pin (\"torch==X.Y.Z\"), found {found}")
    return found[0]


def nvidia_gpu_present(proc_dir=NVIDIA_PROC, smi="nvidia-smi"):
    """Whether this machine has an NVIDIA GPU with its driver loaded."""
    if os.path.isdir(proc_dir):
        return True
    if shutil.which(smi) is None:
        return False
    try:  # nvidia-smi is installed without a GPU on some images: it must also succeed
        return subprocess.run([smi, "-L"], capture_output=True, timeout=20).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def torch_index(platform, has_gpu, override=""):
    """The extra index to install torch from, or None for the default index."""
    if override:
        return None if override == "default" else override
    if platform.startswith("linux") and not has_gpu:
        return CPU_INDEX
    return None


def pip_install_args(platform, has_gpu, override="", requirement="torch==2.13.0"):
    """pip install arguments for torch: the requirement, then the extra index if there is one."""
    index = torch_index(platform, has_gpu, override)
    return [requirement] + (["--extra-index-url", index] if index else [])


def main():
    override = os.environ.get("TORCH_INDEX", "").strip()
    # Detect the GPU only when it decides something (not with an override, not off Linux).
    has_gpu = bool(not override and sys.platform.startswith("linux") and nvidia_gpu_present())
    args = pip_install_args(sys.platform, has_gpu, override, torch_requirement())
    index = args[2] if len(args) > 2 else "the default index"
    print(f"torch for this machine ({sys.platform}, NVIDIA GPU: {'yes' if has_gpu else 'no'}"
          f"{', TORCH_INDEX set' if override else ''}): {args[0]} from {index}", file=sys.stderr)
    print(" ".join(args))


if __name__ == "__main__":
    main()
