"""The set-up files agree: every pin in pyproject.toml is in environment.yml, torch exactly pinned."""
import pathlib
import re

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
