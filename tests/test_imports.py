"""Processes import what they use: the ingress, the response shaper and the ``mlxray`` command
(``--help`` included) load no MLX. Only the model replica does: on a Mac, importing mlx_lm's
generate module makes a GPU stream in the importing process."""

from __future__ import annotations

import subprocess
import sys

import pytest

from .conftest import REPO

LOADED = "import sys; print(sorted(m for m in sys.modules if m.split('.')[0] in ('mlx', 'mlx_lm')))"
PROGRAMS = {
    "ingress": "import deployments.ingress",
    "shaper": "import deployments.shaper",
    "cli": "import deployments.cli",
    "mlxray --help": "from deployments.cli import main\ntry:\n    main(['--help'])\n"
                     "except SystemExit:\n    pass",
}


@pytest.mark.parametrize("name", list(PROGRAMS))
def test_no_mlx_outside_the_replica(name):
    run = subprocess.run([sys.executable, "-c", f"{PROGRAMS[name]}\n{LOADED}"], cwd=REPO,
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.splitlines()[-1] == "[]"


def test_the_replica_does_load_mlx():
    """The check sees MLX where it is imported (it would pass vacuously otherwise)."""
    run = subprocess.run([sys.executable, "-c", f"import deployments.replica\n{LOADED}"],
                         cwd=REPO, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "mlx.core" in run.stdout.splitlines()[-1]
