"""A first run's setup: the Makefile finds a Python mlxray can use (or says which it needs), and
the installed mlx, mlx-lm and ray are within the ranges pyproject.toml pins."""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest

from ..conftest import REPO

OLD_PYTHON = """#!/bin/sh
case "$1" in
  --version) echo "Python 3.9.6" ;;
  *) exit 1 ;;
esac
"""


def make_install(tmp_path, path: str) -> subprocess.CompletedProcess:
    """``make -n install`` (what it would run) with only ``path`` on PATH."""
    return subprocess.run([shutil.which("make"), "-n", "install", f"VENV={tmp_path}/venv"],
                          cwd=REPO, env={"PATH": path}, capture_output=True, text=True,
                          timeout=60)


@pytest.fixture()
def bin_with_old_python3(tmp_path):
    folder = tmp_path / "bin"
    folder.mkdir()
    (folder / "python3").write_text(OLD_PYTHON)
    (folder / "python3").chmod(0o755)
    return folder


def test_make_says_which_python_it_needs(tmp_path, bin_with_old_python3):
    """A stock Mac: python3 is 3.9 and nothing newer is on PATH."""
    run = make_install(tmp_path, str(bin_with_old_python3))
    assert run.returncode != 0
    assert "mlxray needs Python 3.10 or newer, and python3 here is Python 3.9.6" in run.stderr
    assert "make PYTHON=" in run.stderr


def test_make_finds_a_newer_python_beside_an_old_python3(tmp_path, bin_with_old_python3):
    (bin_with_old_python3 / "python3.12").symlink_to(sys.executable)
    run = make_install(tmp_path, str(bin_with_old_python3))
    assert run.returncode == 0, run.stderr
    assert f"python3.12 -m venv {tmp_path}/venv" in run.stdout.splitlines()


def test_installed_versions_are_in_the_pinned_ranges():
    from importlib.metadata import version

    from packaging.requirements import Requirement

    tomllib = pytest.importorskip("tomllib")
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    pinned = {}
    # mlx itself comes with the backend extra make installs (cpu by default on Linux)
    for line in [*project["dependencies"], *project["optional-dependencies"]["cpu"]]:
        requirement = Requirement(line)
        if requirement.marker is None or requirement.marker.evaluate():
            pinned[requirement.name] = requirement.specifier
    for name in ("mlx", "mlx-lm", "ray"):
        assert str(pinned[name]), f"{name} is not pinned"
        assert pinned[name].contains(version(name)), (name, version(name), str(pinned[name]))
