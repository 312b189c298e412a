"""``mlxray --models-dir DIR``: every model under DIR (its .gguf files, folders holding one, mlx-lm
folders), named as llama-server's router names them, served as one application's ``models``;
companions (mmproj, draft) and folders without a model are left out. One real deployment of
such a folder's application answers each model by its name."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from deployments.cli import command as cli
from deployments.cli.refused import Refused
from tests.conftest import MODEL
from tests.gguf_files import REFERENCE_GGUF
from tests.reliability import dedicated_app

APP = "modelsdir"


def loadable_models(root: Path) -> Path:
    """``root`` with an mlx-lm folder and a GGUF file, both loadable."""
    (root / "tiny-mlx").symlink_to(Path(MODEL).resolve(), target_is_directory=True)
    (root / "small.gguf").symlink_to(REFERENCE_GGUF)
    return root


@pytest.fixture(scope="module")
def models_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder of the reference's cases: a GGUF file, its companions, an mlx-lm folder, a
    folder of a split GGUF, and what is no model."""
    root = loadable_models(tmp_path_factory.mktemp("models"))
    for companion in ("mmproj-small.gguf", "mtp-small.gguf", "notes.txt"):
        (root / companion).write_text("")
    split = root / "split"
    split.mkdir()
    for part in ("m-00002-of-00002.gguf", "m-00001-of-00002.gguf", "mmproj-m.gguf"):
        (split / part).write_text("")
    (root / "empty").mkdir()
    return root


def router_args(argv: list[str], environ: dict[str, str] | None = None) -> dict:
    return cli.serve_config(cli.parse(argv, environ or {}))["applications"][0]["args"]


def test_every_model_of_the_folder_is_named_as_the_reference_names_it(models_dir):
    args = router_args(["--models-dir", str(models_dir), "-c", "1024", "-np", "2"])
    assert args["models_dir"] == str(models_dir)
    assert [(m["alias"], Path(m["model"]).name, m["n_ctx"]) for m in args["models"]] == [
        ("small", "small.gguf", 512), ("split", "m-00001-of-00002.gguf", 512),
        ("tiny-mlx", "tiny-mlx", 512)]
    assert router_args([], {"LLAMA_ARG_MODELS_DIR": str(models_dir), "LLAMA_ARG_CTX_SIZE":
                            "1024"})["models"] == router_args(
        ["--models-dir", str(models_dir), "-c", "1024"])["models"]


def test_the_serve_config_names_each_models_deployments(models_dir):
    from ray.serve.schema import ServeDeploySchema

    config = cli.serve_config(cli.parse(["--models-dir", str(models_dir), "-c", "1024"], {}))
    ServeDeploySchema.model_validate(config)
    names = {d["name"] for d in config["applications"][0]["deployments"]}
    assert names == {"Ingress"} | {f"{kind}:{model}" for model in ("small", "split", "tiny-mlx")
                                   for kind in ("ModelReplica", "ResponseShaper")}


@pytest.mark.parametrize("argv,message", [
    (["--models-dir", "/nonexistent"], "'/nonexistent' does not exist or is not a directory"),
    (["--models-dir", "{dir}", "-m", MODEL], "without -m, -hf or -mu"),
    (["--models-dir", "{empty}"], "no model found"),
])
def test_a_models_dir_that_cannot_serve_is_refused(models_dir, argv, message):
    argv = [a.format(dir=models_dir, empty=models_dir / "empty") for a in argv]
    with pytest.raises(Refused, match=message):
        cli.serve_config(cli.parse(argv, {}))


@pytest.fixture(scope="module")
def served(serve_instance: int, tmp_path_factory: pytest.TempPathFactory
           ) -> Iterator[httpx.Client]:
    root = loadable_models(tmp_path_factory.mktemp("served"))
    args = router_args(["--models-dir", str(root), "-c", "512", "-np", "1"])
    with dedicated_app(serve_instance, APP, args,
                       {"ray_actor_options": {"num_cpus": 0.25}}) as base:
        with httpx.Client(base_url=base, timeout=120) as client:
            yield client


def test_each_model_of_the_folder_answers_by_its_name(served):
    listed = served.get("/v1/models").json()
    assert set(listed) == {"data", "object"}  # the router's body: no "models" list
    assert [m["id"] for m in listed["data"]] == ["small", "tiny-mlx"]
    for entry in listed["data"]:  # router mode: nothing is loaded before a request names it
        assert (entry["status"], entry["source"], entry["can_remove"]) == (
            {"value": "unloaded", "args": []}, "models_dir", False)
    for name in ("small", "tiny-mlx"):
        answer = served.post("/completion", json={"prompt": "def f():", "n_predict": 2,
                                                  "model": name})
        assert answer.status_code == 200, answer.text
        assert answer.json()["model"] == name
    listed = served.get("/v1/models").json()["data"]
    assert [m["status"]["value"] for m in listed] == ["loaded", "loaded"]


def test_a_config_with_models_dir_serves_the_folder_as_the_command_does(models_dir):
    """configs/*.yaml's ``models_dir`` alone: the same models as ``mlxray --models-dir``."""
    from pydantic import ValidationError

    from deployments.api.config import GraphArgs

    command = router_args(["--models-dir", str(models_dir), "-c", "1024", "-np", "2"])
    config = GraphArgs.model_validate({"models_dir": str(models_dir), "n_parallel": 2,
                                       "n_ctx": 512})
    assert config.routed and config.model == command["models"][0]["model"]
    assert [(c.model_name, c.model, c.n_ctx, c.n_parallel) for c in config.model_configs()] == [
        (m["alias"], m["model"], 512, 2) for m in command["models"]]
    with pytest.raises(ValidationError, match="no model found"):
        GraphArgs.model_validate({"models_dir": str(models_dir / "empty")})
    with pytest.raises(ValidationError, match="mlxray --models-preset FILE --dump-config"):
        GraphArgs.model_validate({"models_preset": "p.ini"})
