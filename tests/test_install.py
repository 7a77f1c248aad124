"""Ways in other than `make lab`: the Colab install cell and a plain `pip install` (JupyterHub), for real.

The slow test builds one fresh virtual environment and goes through both paths a newcomer takes:
1. Colab: the install cell of chapter 00, run where `helpers` cannot be imported, with COURSE_REPO pointing at
   a local copy of this repository: it must clone it, `pip install -e` it (the course's whole dependency set,
   from pip's wheel cache and this machine's local torch wheel) and move into the clone's chapters/ folder.
2. JupyterHub: `pip install <repository>` into the same environment, as the README documents it (the
   dependencies are already there, so this installs the course itself, not editable), then chapter 00 runs
   with papermill in that environment, importing `helpers` from its site-packages.
Measured on the 2-core build machine with other work running (load 15-30): 5 min 31 s, of which the Colab
cell's install 202 s (pip's wheel cache warm, torch from a local wheel), `pip install <repository>` 24 s and
chapter 00 65 s.
"""
import importlib.util
import json
import os
import pathlib
import shutil
import subprocess
import sys
import time

import nbformat
import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
CHAPTER = "00_first_distributed_program.ipynb"


def load_script(name):
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


colab = load_script("colab_cell")
pip_args = load_script("pip_install_args")
NOTEBOOKS = sorted(p for folder in ("chapters", "solutions", "labs") for p in (ROOT / folder).glob("*.ipynb"))


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_first_code_cell_installs_the_course(path):
    nb = nbformat.read(path, as_version=4)
    first = next(c for c in nb.cells if c.cell_type == "code")
    folder = colab.WORKING_FOLDER[path.parent.name]
    assert first.source == colab.cell_source(folder), (
        f"{path.relative_to(ROOT)}: the first code cell is not the current install cell; run "
        f"`.venv/bin/python scripts/colab_cell.py` and `make labs`")
    assert "parameters" not in first.metadata.get("tags", []), "the parameters cell must stay a separate cell"


def run(command, cwd, env, timeout):
    """Run a command; on failure, fail the test with its output."""
    done = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        pytest.fail(f"{' '.join(map(str, command))} exited {done.returncode}:\n{done.stdout[-3000:]}\n"
                    f"{done.stderr[-3000:]}")
    return done.stdout


def copy_of_repository(target):
    """The repository's tracked files as they are now (uncommitted edits included), as a git repository."""
    tracked = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, text=True, check=True,
                             timeout=60).stdout.split("\0")
    for name in filter(None, tracked):
        if (ROOT / name).is_file():
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, target / name)
    git = ["git", "-c", "user.name=test", "-c", "user.email=test@example.org"]
    for command in (["init", "-q"], ["add", "-A"], ["commit", "-q", "-m", "copy"]):
        subprocess.run(git + command, cwd=target, check=True, capture_output=True, timeout=120)
    return target


def clean_env():
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV", "JUPYTER"))}
    env.pop("MPLBACKEND", None)  # as on a fresh machine
    env["PIP_COMPILE"] = "0"  # no .pyc for torch's many files: the install is under test, not compiling
    return env


@pytest.mark.slow
@pytest.mark.install  # `make test-install`, which .ci/run runs after `make test`: 3-5 min of pip alone
@pytest.mark.timeout(1500)
def test_colab_cell_then_pip_install_run_chapter_00(tmp_path):
    repository = copy_of_repository(tmp_path / "repository")
    venv, env, timings = tmp_path / "venv", clean_env(), {}
    run([sys.executable, "-m", "venv", str(venv)], tmp_path, env, 300)
    python = str(venv / "bin" / "python")

    # 1. Colab: the install cell, in a process of the fresh environment, where helpers does not import.
    colab_dir = tmp_path / "colab"
    colab_dir.mkdir()
    cell = colab.cell_source("chapters", repo=repository.as_uri())
    probe = "\nimport helpers, os\nprint('HELPERS', helpers.__file__)\nprint('CWD', os.getcwd())\n"
    start = time.perf_counter()
    out = run([python, "-c", cell + probe], colab_dir, env, 1200)
    timings["colab cell (clone + pip install -e)"] = time.perf_counter() - start
    clone = colab_dir / "data-parallelism-hands-on"
    assert "installed the course from" in out, f"the cell did not say what it did:\n{out}"
    assert f"HELPERS {clone / 'helpers' / '__init__.py'}" in out, f"helpers not from the clone:\n{out}"
    assert f"CWD {clone / 'chapters'}" in out, f"the cell did not move into the clone's chapters/:\n{out}"

    # 2. JupyterHub: pip install <repository>, as the README documents it (extra index chosen per machine;
    #    --retries 0 so that an index this machine cannot reach costs nothing per package).
    index = pip_args.pip_install_args(sys.platform, pip_args.nvidia_gpu_present())[1:]
    start = time.perf_counter()
    install = [python, "-m", "pip", "install", "--quiet", "--retries", "0", *index, str(repository)]
    run(install, tmp_path, env, 1200)
    timings["pip install <repository>"] = time.perf_counter() - start
    where = run([python, "-c", "import helpers; print(helpers.__file__)"], tmp_path, env, 120).strip()
    assert where.startswith(str(venv)), f"helpers imported from {where}, not from the environment"

    start = time.perf_counter()
    executed = tmp_path / "executed.ipynb"
    run([python, "-m", "papermill", "--cwd", str(repository / "chapters"), "-k", "python3",
         str(repository / "chapters" / CHAPTER), str(executed)], tmp_path, env, 600)
    timings["papermill chapter 00"] = time.perf_counter() - start
    nb = json.loads(executed.read_text())
    errors = [o for c in nb["cells"] if c["cell_type"] == "code" for o in c.get("outputs", [])
              if o.get("output_type") == "error"]
    assert not errors, f"chapter 00 raised in the fresh environment: {errors[0].get('ename')}"
    print("; ".join(f"{k}: {v:.0f} s" for k, v in timings.items()))
