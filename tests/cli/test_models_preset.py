"""``mlxray --models-preset FILE``: llama-server's INI preset of per-model settings in router mode,
read as the reference reads it (common/preset.cpp): sections, comments, keys as flags without
dashes, short flags or variables, ``[*]`` for every model, the command line over the section
over ``[*]``, the preset-only keys, and the reference's errors. One real deployment shows a
preset's model loaded at start and each model answering with its own settings."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from deployments.cli import command as cli
from deployments.cli import preset
from deployments.cli.refused import Refused
from tests.conftest import MODEL
from tests.reliability import dedicated_app

APP = "preset"


def write(path: Path, text: str) -> str:
    path.write_text(text)
    return str(path)


def router_args(argv: list[str], environ: dict[str, str] | None = None) -> dict:
    return cli.serve_config(cli.parse(argv, environ or {}))["applications"][0]["args"]


def models(args: dict) -> dict[str, dict]:
    return {m["alias"]: m for m in args["models"]}


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    root = tmp_path / "models"
    root.mkdir()
    (root / "tiny-a").symlink_to(Path(MODEL).resolve(), target_is_directory=True)
    (root / "tiny-b").symlink_to(Path(MODEL).resolve(), target_is_directory=True)
    return root


def test_the_ini_is_read_as_the_reference_reads_it(tmp_path):
    path = write(tmp_path / "p.ini", "version = 1\n; a comment\n# another\n\n[*]\nc = 1024 ; c\n"
                 "[org/m:q4_k_m]\nn-predict=7# seven\r\n[empty]\n[org/m:Q4_K_M]\ntemp = 0\n")
    sections = preset.read_ini(path)
    assert sections == {"default": {"version": "1"}, "*": {"c": "1024"},
                        "org/m:q4_k_m": {"n-predict": "7"}, "empty": {},
                        "org/m:Q4_K_M": {"temp": "0"}}
    assert [preset.canonical_name(n) for n in ("org/m:q4_k_m", "a:model.q8_0", "plain")] == [
        "org/m:Q4_K_M", "a:Q8_0", "plain"]
    with pytest.raises(Refused, match="failed to parse server config file"):
        preset.read_ini(write(tmp_path / "bad.ini", "[ok]\nthis line is no key\n"))
    with pytest.raises(Refused, match="preset file does not exist"):
        preset.read_ini(str(tmp_path / "missing.ini"))


def test_each_model_gets_its_section_over_the_global_one_under_the_command_line(folder, tmp_path):
    ini = write(tmp_path / "p.ini", f"""
[*]
n-predict = 11
temp = 0.5
LLAMA_ARG_CTX_SIZE = 2048

[tiny-a]
n = 22
c = 1024
no-cache-prompt = true
load-on-startup = true

[custom]
model = {MODEL}
top-k = 3
""")
    args = router_args(["--models-dir", str(folder), "--models-preset", ini, "-np", "2",
                        "--temp", "0.25"])
    by_name = models(args)
    assert sorted(by_name) == ["custom", "tiny-a", "tiny-b"]
    a, b, custom = by_name["tiny-a"], by_name["tiny-b"], by_name["custom"]
    assert (a["n_predict"], a["n_ctx"], a["cache_prompt"], a["load_on_startup"]) == (
        22, 512, False, True)
    assert (b["n_predict"], b["n_ctx"], b.get("load_on_startup", False)) == (11, 1024, False)
    assert all(m["temperature"] == 0.25 for m in by_name.values())  # the command line wins
    assert custom["sampling"]["top_k"] == 3 and custom["model"] == str(Path(MODEL).absolute())
    assert [m["model_source"] for m in (a, b, custom)] == ["preset", "models_dir", "preset"]
    assert args["models_preset"] == ini
    # a preset alone is router mode too; there its sections for the folder's models name none
    with pytest.raises(Refused, match="preset 'tiny-a' names no model file"):
        router_args(["--models-preset", ini])
    own = write(tmp_path / "own.ini", f"[custom]\nmodel = {MODEL}\n")
    alone = router_args(["--models-preset", own])
    assert sorted(models(alone)) == ["custom"] and "models_dir" not in alone
    assert router_args([], {"LLAMA_ARG_MODELS_PRESET": own})["models"] == alone["models"]


@pytest.mark.parametrize(("text", "message"), [
    ("[m]\nmodel = X\nno-such-flag = 1\n", "option 'no-such-flag' not recognized in preset 'm'"),
    ("[m]\nn-predict = 3\n", "preset 'm' names no model file"),
    ("[m]\nmodel = X\nmetrics = maybe\n", "invalid boolean value"),
    ("[m]\nmodel = X\nnuma = distribute\n", "--numa: MLX places its memory itself"),
    ("[m]\nmodel = X\nalias = n\n[n]\nmodel = X\n",
     "alias 'n' for model 'm' conflicts with existing model name or alias"),
    ("[*]\nalias = all\n[m]\nmodel = X\n", "alias 'all' would name every model"),
    ("[a]\nmodel = X\nload-on-startup = 1\n[b]\nmodel = X\nload-on-startup = on\n",
     r"number of models to load on startup \(2\) exceeds models_max \(1\)"),
])
def test_a_preset_that_cannot_serve_is_refused(tmp_path, text, message):
    ini = write(tmp_path / "p.ini", text.replace("= X", f"= {MODEL}"))
    with pytest.raises((Refused, ValueError), match=message):  # ValueError: GraphArgs' own
        router_args(["--models-preset", ini, "--models-max", "1"])


def test_what_the_router_sets_is_dropped_and_stop_timeout_is_reported(tmp_path, caplog):
    ini = write(tmp_path / "p.ini", f"[m]\nmodel = {MODEL}\nport = 9999\napi-key = k\n"
                "stop-timeout = 3\n")
    with caplog.at_level("WARNING", logger="mlxray"):
        args = router_args(["--models-preset", ini, "--port", "8123"])
    entry = models(args)["m"]
    assert "api_key" not in entry and "api_key" not in args
    assert "port is set by the router" in caplog.text
    assert "stop-timeout accepted" in caplog.text


@pytest.fixture(scope="module")
def served(serve_instance: int, tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("preset")
    (root / "models").mkdir()
    (root / "models" / "tiny-a").symlink_to(Path(MODEL).resolve(), target_is_directory=True)
    ini = write(root / "p.ini", f"[*]\nn-predict = 2\n[tiny-a]\nn-predict = 3\n"
                f"[custom]\nmodel = {MODEL}\nload-on-startup = true\nalias = c2, c1\n")
    args = router_args(["--models-dir", str(root / "models"), "--models-preset", ini, "-c", "512",
                        "-np", "1", "--temp", "0"])
    cpu = {"ray_actor_options": {"num_cpus": 0.25}}
    with dedicated_app(serve_instance, APP, args, cpu) as base:
        with httpx.Client(base_url=base, timeout=120) as client:
            yield client


def test_a_preset_model_loads_at_start_and_each_answers_with_its_settings(served):
    import time

    deadline = time.monotonic() + 60
    while (status := {m["id"]: m["status"]["value"] for m in served.get("/models").json()[
            "data"]})["custom"] != "loaded":  # no request asked for it
        assert time.monotonic() < deadline, status
        time.sleep(0.2)
    assert status["tiny-a"] == "unloaded"
    sources = {m["id"]: m["source"] for m in served.get("/models").json()["data"]}
    assert sources == {"custom": "preset", "tiny-a": "preset"}
    aliases = {m["id"]: m["aliases"] for m in served.get("/models").json()["data"]}
    assert aliases == {"custom": ["c1", "c2"], "tiny-a": []}
    by_alias = served.post("/completion", json={"prompt": "def f():", "model": "c1"})
    assert by_alias.status_code == 200 and by_alias.json()["tokens_predicted"] == 2
    assert served.post("/models/load", json={"model": "c2"}).json()["error"]["message"] == (
        "model is already running")
    for name, n in (("custom", 2), ("tiny-a", 3)):
        answer = served.post("/completion", json={"prompt": "def f():", "model": name,
                                                  "ignore_eos": True})
        assert answer.status_code == 200, answer.text
        assert answer.json()["tokens_predicted"] == n, name
