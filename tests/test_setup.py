"""Set-up: pins agree (pyproject.toml, environment.yml); the torch build and `make lab` options per machine."""
import importlib.util
import pathlib
import re
import subprocess
import sys

import pytest
import tomllib

ROOT = pathlib.Path(__file__).resolve().parent.parent


def pyproject_pins():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return set(project["dependencies"]) | set(project["optional-dependencies"]["dev"])


def environment_pins():
    return set(re.findall(r"^\s+- ([A-Za-z0-9_.\-]+==[^\s]+)$", (ROOT / "environment.yml").read_text(), re.M))


def test_every_pin_is_exact():
    assert all("==" in pin for pin in pyproject_pins()), "pin every dependency exactly (==)"


def test_torch_pinned_exactly():
    assert "torch==2.13.0" in pyproject_pins()


def test_environment_yml_matches_pyproject():
    assert environment_pins() == pyproject_pins()


def test_ci_runs_the_readme_test_command():
    assert "make test" in (ROOT / ".ci/run").read_text()
    assert "make test" in (ROOT / "README.md").read_text()
    assert "make test" in (ROOT / "TESTING.md").read_text()


# --- which torch build `make setup` installs (scripts/pip_install_args.py) ---------------------------------

SCRIPTS = ROOT / "scripts"


def load_script(name):
    spec = importlib.util.spec_from_file_location(name, SCRIPTS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


pip_args = load_script("pip_install_args")
CPU = ["--extra-index-url", "https://download.pytorch.org/whl/cpu"]


@pytest.mark.parametrize("platform, has_gpu, override, expected", [
    ("linux", False, "", ["torch==2.13.0"] + CPU),                       # a CPU laptop or server
    ("linux", True, "", ["torch==2.13.0"]),                              # GPU: PyPI's CUDA build
    ("darwin", False, "", ["torch==2.13.0"]),                            # macOS: PyPI's wheel has no CUDA
    ("win32", False, "", ["torch==2.13.0"]),
    ("win32", True, "", ["torch==2.13.0"]),
    ("linux", False, "https://download.pytorch.org/whl/cu126",
     ["torch==2.13.0", "--extra-index-url", "https://download.pytorch.org/whl/cu126"]),
    ("linux", True, "https://download.pytorch.org/whl/cpu", ["torch==2.13.0"] + CPU),
    ("linux", False, "default", ["torch==2.13.0"]),                      # force PyPI on a CPU machine
    ("darwin", False, "https://example.org/simple",
     ["torch==2.13.0", "--extra-index-url", "https://example.org/simple"]),
])
def test_pip_command_per_machine(platform, has_gpu, override, expected):
    got = pip_args.pip_install_args(platform, has_gpu, override, "torch==2.13.0")
    assert got == expected, f"{platform}, GPU {has_gpu}, TORCH_INDEX={override!r}: {got}, expected {expected}"


def test_the_cpu_index_is_extra_never_the_only_index():
    # --index-url would hide the default index, find-links' local wheels and pip's cache.
    assert "--index-url" not in pip_args.pip_install_args("linux", False)
    assert "--index-url" not in (ROOT / "Makefile").read_text()


def test_torch_requirement_is_read_from_pyproject(tmp_path):
    assert pip_args.torch_requirement() == "torch==2.13.0"
    bad = tmp_path / "pyproject.toml"
    bad.write_text('dependencies = ["torch>=2"]\n')
    with pytest.raises(SystemExit, match="expected one exact torch pin"):
        pip_args.torch_requirement(bad)


def test_gpu_detection(tmp_path):
    proc = tmp_path / "nvidia"
    assert not pip_args.nvidia_gpu_present(str(proc), smi="no-such-nvidia-smi")
    proc.mkdir()
    assert pip_args.nvidia_gpu_present(str(proc), smi="no-such-nvidia-smi")
    # An nvidia-smi that is installed but fails (no GPU, no driver) is no GPU.
    failing = tmp_path / "nvidia-smi"
    failing.write_text("#!/bin/sh\necho 'NVIDIA-SMI has failed' >&2\nexit 9\n")
    failing.chmod(0o755)
    assert not pip_args.nvidia_gpu_present(str(tmp_path / "absent"), smi=str(failing))
    failing.write_text("#!/bin/sh\necho 'GPU 0: NVIDIA A100'\n")
    assert pip_args.nvidia_gpu_present(str(tmp_path / "absent"), smi=str(failing))


def run_script(name, **env):
    return subprocess.run([sys.executable, str(SCRIPTS / f"{name}.py")], capture_output=True, text=True,
                          timeout=60, env={"PATH": "/usr/bin:/bin", **env}, check=True)


@pytest.mark.timeout(60)
def test_script_on_this_machine_and_with_overrides():
    has_gpu = pip_args.nvidia_gpu_present()
    expected = ["torch==2.13.0"] + ([] if has_gpu or not sys.platform.startswith("linux") else CPU)
    assert run_script("pip_install_args").stdout.split() == expected
    url = "https://download.pytorch.org/whl/cu126"
    with_url = run_script("pip_install_args", TORCH_INDEX=url).stdout.split()
    assert with_url == ["torch==2.13.0", "--extra-index-url", url]
    assert run_script("pip_install_args", TORCH_INDEX="default").stdout.split() == ["torch==2.13.0"]


def test_makefile_installs_torch_alone_with_the_chosen_index():
    makefile = (ROOT / "Makefile").read_text()
    assert 'TORCH_INDEX="$(TORCH_INDEX)" $(PY) scripts/pip_install_args.py' in makefile
    assert "--no-deps $$args" in makefile, "torch alone, so the extra index is asked about torch only"


# --- `make lab`'s options per machine (scripts/lab_args.py) -------------------------------------------------

lab = load_script("lab_args")


@pytest.mark.parametrize("euid, platform, environ, expected", [
    (0, "linux", {}, ["--allow-root", "--no-browser"]),                  # a container
    (1000, "linux", {}, ["--no-browser"]),                               # ssh to a server
    (1000, "linux", {"DISPLAY": ":0"}, []),                              # a Linux desktop
    (1000, "linux", {"WAYLAND_DISPLAY": "wayland-0"}, []),
    (0, "linux", {"DISPLAY": ":0"}, ["--allow-root"]),
    (501, "darwin", {}, []),                                             # macOS has no DISPLAY, and a browser
    (-1, "win32", {}, []),
])
def test_lab_args_per_machine(euid, platform, environ, expected):
    assert lab.lab_args(euid, platform, environ) == expected
