"""The ``mlxray`` command: llama-server's flags and LLAMA_ARG_* variables into a Ray Serve config,
refusals that name the flag, and one real run with the API key enforced."""

from __future__ import annotations

import pytest
import yaml

from deployments.api.config import GraphArgs
from deployments.cli import command as cli
from deployments.cli.refused import YARN
from deployments.serve.endpoint import api_keys
from tests.conftest import MODEL, REPO


def config_of(argv: list[str], environ: dict[str, str] | None = None) -> dict:
    return cli.serve_config(cli.parse(argv, environ or {}))


def app_args(config: dict) -> dict:
    return config["applications"][0]["args"]


def test_flags_build_the_serve_config():
    config = config_of(["-m", MODEL, "--host", "0.0.0.0", "--port", "9001", "-np", "2",
                        "-c", "4096", "-b", "64", "-n", "32", "--alias", "tiny", "--api-key",
                        "k", "--metrics", "--no-slots", "--props", "--temp", "0.5",
                        "--seed", "7", "--no-cache-prompt", "--embedding", "--pooling",
                        "mean", "--slot-save-path", "/tmp/slots", "--spm-infill"])
    assert config["http_options"] == {"host": "0.0.0.0", "port": 9001}
    assert app_args(config) == {
        "model": MODEL, "alias": "tiny", "n_parallel": 2, "n_ctx": 2048, "n_batch": 64,
        "n_predict": 32, "temperature": 0.5, "seed": 7, "cache_prompt": False, "metrics": True,
        "slots": False, "props": True, "api_key": "k", "slot_save_path": "/tmp/slots",
        "embeddings": True, "pooling": "mean", "spm_infill": True, "batch_size": 64}
    replica = config["applications"][0]["deployments"][2]
    # the graph's rule (deployments/api/config.py): 2 slots + a queue of 256 + 16 for control calls
    assert replica["name"] == "ModelReplica" and replica["max_ongoing_requests"] == 274


def test_llama_server_defaults():
    """Port 8080, 4 slots, -c 0: the model's 2048 training positions split across the slots."""
    config = config_of([])
    assert config["http_options"] == {"host": "127.0.0.1", "port": 8080}
    args = app_args(config)
    assert (args["n_parallel"], args["n_ctx"], args["n_batch"]) == (4, 512, 2048)
    assert "seed" not in args and "api_key" not in args  # random seed, no key


def test_environment_variables_and_flag_precedence():
    env = {"LLAMA_ARG_N_PARALLEL": "2", "LLAMA_ARG_CTX_SIZE": "1024", "LLAMA_API_KEY": "env-key",
           "LLAMA_ARG_ENDPOINT_METRICS": "1", "LLAMA_ARG_ENDPOINT_SLOTS": "0",
           "LLAMA_ARG_PORT": "9002", "LLAMA_ARG_ALIAS": "from-env"}
    args = app_args(config_of(["--alias", "from-flag"], env))
    assert (args["n_parallel"], args["n_ctx"], args["api_key"]) == (2, 512, "env-key")
    assert args["metrics"] is True and args["slots"] is False and args["alias"] == "from-flag"
    assert config_of([], env)["http_options"]["port"] == 9002


@pytest.mark.parametrize("argv,environ,named", [
    (["--numa", "distribute"], {}, "--numa"),
    (["-ts", "1,1", "--mmproj", "a.gguf"], {}, "-ts, --mmproj"),
    (["--yarn-ext-factor=1"], {}, "--yarn-ext-factor"),
    ([], {"LLAMA_ARG_CACHE_REUSE": "256"}, "LLAMA_ARG_CACHE_REUSE"),
])
def test_unhonored_options_are_refused_by_name(argv, environ, named):
    with pytest.raises(cli.Refused, match=f"does not honor these llama-server options: {named}"):
        cli.parse(argv, environ)


def test_refusals_give_each_option_its_reason():
    with pytest.raises(cli.Refused) as refused:
        cli.parse(["-ts", "1,1", "--yarn-ext-factor", "1"], {"LLAMA_ARG_NUMA": "distribute"})
    lines = str(refused.value).splitlines()
    assert lines[1:] == [
        f"  -ts: {cli.TENSOR_SPLIT}",
        f"  --yarn-ext-factor: {YARN}",
        "  LLAMA_ARG_NUMA: MLX places its memory itself"]


@pytest.mark.parametrize("accepted,refused,env,env_refused", [
    (["-cb", "--cont-batching"], ["-nocb", "--no-cont-batching"], "LLAMA_ARG_CONT_BATCHING", "0"),
    (["--jinja"], ["--no-jinja"], "LLAMA_ARG_JINJA", "off"),
    (["--no-context-shift"], ["--context-shift"], "LLAMA_ARG_CONTEXT_SHIFT", "1"),
])
def test_one_way_switches(accepted, refused, env, env_refused):
    """What mlxray always does (continuous batching, Jinja templates, no context shift) may be
    asked for and changes nothing; the other way is refused, naming the spelling."""
    for flag in accepted:
        assert config_of([flag]) == config_of([])
    for flag in refused:
        with pytest.raises(cli.Refused, match=f"does not honor {flag}: "):
            cli.parse([flag], {})
    with pytest.raises(cli.Refused, match=f"does not honor {env}={env_refused}: "):
        cli.parse([], {env: env_refused})
    assert config_of([accepted[0]], {env: env_refused}) == config_of([])  # the flag wins


def test_webui_switch():
    """The page at / is on by default, as llama-server's UI; --no-webui or LLAMA_ARG_WEBUI=0 turn
    it off, the flag winning over the variable (what / answers: tests/serve/test_webui.py)."""
    def webui(argv: list[str], environ: dict[str, str] | None = None) -> bool:
        return cli.graph_args(cli.parse(argv, environ or {})).webui

    assert webui([]) is True
    assert webui(["--no-webui"]) is False
    assert webui([], {"LLAMA_ARG_WEBUI": "0"}) is False
    assert webui(["--webui"], {"LLAMA_ARG_WEBUI": "0"}) is True
    assert webui(["--no-ui"]) is False and webui(["--ui"], {"LLAMA_ARG_WEBUI": "0"}) is True
    assert app_args(config_of(["--no-webui"]))["webui"] is False


def test_comma_separated_aliases_and_tags_name_the_model():
    """llama.cpp's test_server_model_aliases_and_tags: -a's names sorted, the first the model's
    id, all of them its aliases, and --tags, as GET /models lists them (a request by an alias:
    tests/cli/test_models_preset.py)."""
    from deployments.api.model_entries import oai_entry

    graph = cli.graph_args(cli.parse(["-a", "tinyllama-2, fim,code", "--tags", "chat,fim,small"],
                                     {}))
    assert (graph.model_name, graph.aliases, graph.tags) == (
        "code", ("fim", "tinyllama-2"), ("chat", "fim", "small"))
    info = {"n_vocab": 1, "n_ctx_train": 1, "n_embd": 1, "n_params": 1, "size": 1, "ftype": ""}
    entry = oai_entry(graph, info, 0, graph.model_name)
    assert (entry["id"], entry["aliases"], entry["tags"]) == (
        "code", ["code", "fim", "tinyllama-2"], ["chat", "fim", "small"])
    assert cli.graph_args(cli.parse(["--tags", "x"], {"LLAMA_ARG_TAGS": "y"})).tags == ("x",)
    assert cli.graph_args(cli.parse([], {"LLAMA_ARG_ALIAS": "b,a"})).model_name == "a"


def test_reasoning_flags_and_the_values_the_reference_refuses():
    """--reasoning-format (LLAMA_ARG_THINK) and --reasoning-budget (LLAMA_ARG_THINK_BUDGET) are
    the defaults of a request's reasoning_format and reasoning_budget_tokens (their effect:
    tests/serve/test_surface.py); a value llama-server refuses stops the command with its
    message."""
    def reasoning(argv: list[str], environ: dict[str, str] | None = None) -> tuple:
        args = cli.graph_args(cli.parse(argv, environ or {}))
        return args.reasoning_format, args.reasoning_budget_tokens

    assert reasoning([]) == ("deepseek", -1)  # the reference's code defaults
    assert "reasoning_format" not in app_args(config_of([]))
    assert reasoning(["--reasoning-format", "deepseek-legacy", "--reasoning-budget", "16"]) == (
        "deepseek-legacy", 16)
    env = {"LLAMA_ARG_THINK": "none", "LLAMA_ARG_THINK_BUDGET": "0"}
    assert reasoning([], env) == ("none", 0)
    assert reasoning(["--reasoning-budget=-1"], env) == ("none", -1)  # the flag wins
    for argv, environ, message in [
        (["--reasoning-format", "think"], {},
         'error while handling argument "--reasoning-format": Unknown reasoning format: think'),
        (["--reasoning-budget", "-2"], {},
         'error while handling argument "--reasoning-budget": invalid value'),
        ([], {"LLAMA_ARG_THINK": "DeepSeek"},
         'error while handling environment variable "LLAMA_ARG_THINK": Unknown reasoning format: '
         'DeepSeek'),
    ]:
        with pytest.raises(cli.Refused) as refused:
            cli.parse(argv, environ)
        assert str(refused.value) == message


def test_api_keys_from_the_flag_and_the_file(tmp_path):
    """llama-server gathers --api-key (comma-separated) and --api-key-file (one per line, #
    comments) into one list; any key of it is accepted."""
    keys = tmp_path / "keys"
    keys.write_text("# team keys\nk3\n\n  k4 \n")
    args = app_args(config_of(["--api-key", "k1,k2", "--api-key-file", str(keys)]))
    assert (args["api_key"], args["api_key_file"]) == ("k1,k2", str(keys))  # no key in it
    assert api_keys(GraphArgs.model_validate(args)) == ["k1", "k2", "k3", "  k4 "]
    with pytest.raises(cli.Refused, match="--api-key-file"):
        config_of(["--api-key-file", str(tmp_path / "missing")])


def test_api_prefix_is_the_route_prefix():
    assert config_of(["--api-prefix", "/llm/"])["applications"][0]["route_prefix"] == "/llm"
    env = config_of([], {"LLAMA_ARG_API_PREFIX": "/v2"})
    assert env["applications"][0]["route_prefix"] == "/v2"
    with pytest.raises(cli.Refused, match="must start with /"):
        config_of(["--api-prefix", "llm"])


def test_several_keys_are_each_accepted():
    from types import SimpleNamespace

    from deployments.api.errors import ApiError
    from deployments.serve.endpoint import IngressBase

    ingress = object.__new__(IngressBase)
    ingress.api_keys = api_keys(GraphArgs(api_key="k1,k2"))

    def request(key: str):
        return SimpleNamespace(url=SimpleNamespace(path="/completion"), method="POST",
                               headers={"authorization": f"Bearer {key}"})

    for key in ("k1", "k2"):
        ingress.check_key(request(key))
    for key in ("k1,k2", "k3", ""):
        with pytest.raises(ApiError):
            ingress.check_key(request(key))


def test_bad_values_are_usage_errors(capsys):
    with pytest.raises(SystemExit) as exited:
        cli.main(["-np", "0", "--dump-config"])
    assert exited.value.code == 2
    assert "n_parallel" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli.main(["--no-such-flag"])


def test_dump_config_is_a_serve_config(capsys):
    from ray.serve.schema import ServeDeploySchema

    cli.main(["-m", MODEL, "-np", "2", "--dump-config"])
    schema = ServeDeploySchema.model_validate(yaml.safe_load(capsys.readouterr().out))
    assert schema.applications[0].import_path == "deployments.serve.graph:build_app"


def test_dump_config_carries_the_shipped_configs_runtime_env(capsys):
    """The replica event-loop settings of configs/local.yaml (docs/performance.md): the
    command's graph runs as the shipped configs' does."""
    cli.main(["-m", MODEL, "--dump-config"])
    dumped = yaml.safe_load(capsys.readouterr().out)["applications"][0]["runtime_env"]
    assert dumped["env_vars"]["RAY_SERVE_RUN_USER_CODE_IN_SEPARATE_THREAD"] == "0"
    assert dumped["env_vars"]["RAY_SERVE_REPLICA_GRPC_MAX_MESSAGE_LENGTH"] == str(2**31 - 1)
    for name in ("local.yaml", "conformance.yaml", "multi-model.yaml", "cluster.yaml",
                 "sharded.yaml", "autoscale.yaml"):
        shipped = yaml.safe_load((REPO / "configs" / name).read_text())["applications"]
        assert all(app["runtime_env"] == dumped for app in shipped), name
