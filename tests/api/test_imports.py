"""Processes import what they use: the ingress, the response shaper and the ``mlxray`` command
(``--help`` included) load no MLX. Only the model replica's MLX engine does: on a Mac,
importing mlx_lm's generate module makes a GPU stream in the importing process."""

from __future__ import annotations

import ast
import subprocess
import sys

import pytest

from ..conftest import REPO

LOADED = "import sys; print(sorted(m for m in sys.modules if m.split('.')[0] in ('mlx', 'mlx_lm')))"
PROGRAMS = {
    "ingress": "import deployments.serve.ingress",
    "shaper": "import deployments.serve.shaper",
    "cli": "import deployments.cli.command",
    "mlxray --help": "from deployments.cli.command import main\ntry:\n    main(['--help'])\n"
                     "except SystemExit:\n    pass",
}


@pytest.mark.parametrize("name", list(PROGRAMS))
def test_no_mlx_outside_the_replica(name):
    run = subprocess.run([sys.executable, "-c", f"{PROGRAMS[name]}\n{LOADED}"], cwd=REPO,
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.splitlines()[-1] == "[]"


def test_the_mlx_engine_does_load_mlx():
    """The check sees MLX where it is imported (it would pass vacuously otherwise): in a
    replica, once it makes its MLX engine (deployments/serve/engines.py imports it there; a
    replica on the fake engine loads none: tests/engine/test_fake.py)."""
    program = "import deployments.serve.replica\nfrom engine.scheduler import Engine"
    run = subprocess.run([sys.executable, "-c", f"{program}\n{LOADED}"],
                         cwd=REPO, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "mlx.core" in run.stdout.splitlines()[-1]


API = REPO / "deployments" / "api"
FRAMEWORKS = ("ray", "fastapi", "starlette", "mlx", "mlx_lm")
UPPER_LAYERS = ("deployments.serve", "deployments.cli")


def imported_names(path) -> list[str]:
    """Every module an ``import`` in the file names, function-local and TYPE_CHECKING ones too."""
    names = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.append(node.module)
    return names


def test_the_api_layer_names_no_framework_and_no_upper_layer():
    """deployments/api is the llama-server API as data: no import of Ray, FastAPI or MLX, nor of
    the graph or the command line that build on it, anywhere in its files."""
    offending = {}
    for path in sorted(API.rglob("*.py")):
        bad = [name for name in imported_names(path)
               if name.split(".")[0] in FRAMEWORKS or name.startswith(UPPER_LAYERS)]
        if bad:
            offending[str(path.relative_to(REPO))] = bad
    assert offending == {}


def test_importing_the_api_layer_loads_no_framework():
    """Its engine imports (types, checks, vocabularies) load no framework either."""
    modules = sorted(".".join(p.relative_to(REPO).with_suffix("").parts).removesuffix(".__init__")
                     for p in API.rglob("*.py"))
    code = "\n".join(f"import {m}" for m in modules) + (
        "\nimport sys\nprint(sorted({m.split('.')[0] for m in sys.modules} & "
        f"{set(FRAMEWORKS)!r}))")
    run = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.splitlines()[-1] == "[]"
