"""The linter the project is configured for (pyproject.toml [tool.ruff]) finds nothing in the Python sources."""
import shutil
import subprocess
import sys

import pytest

from helpers.grading.prepare.labgen import ROOT


@pytest.mark.timeout(60)
def test_ruff_finds_nothing():
    ruff = shutil.which("ruff", path=str(ROOT / ".venv" / "bin")) or shutil.which("ruff")
    command = [ruff] if ruff else [sys.executable, "-m", "ruff"]
    done = subprocess.run([*command, "check", "--no-cache", "."], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, ("ruff check found problems (fix them, or run `ruff check --fix .`):\n"
                                  f"{done.stdout[-4000:]}")
