"""llama-server command lines as model cards, READMEs and guides give them, run unchanged through
``mlxray ... --dump-config``: the Ray Serve config each produces; and one served graph built from
such a line, whose sampling defaults show in /props and in a request's generation_settings,
and steer the sampling until a request's own field overrides them."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import httpx
import pytest
import yaml
from ray.serve.schema import ServeDeploySchema

from deployments.cli import command as cli
from tests.conftest import MODEL, REPO
from tests.reliability import dedicated_app

GGUF = REPO / "tests" / "fixtures" / "model.gguf"
TEMPLATE_FILE = str(REPO / "models" / "tiny-python-tools.jinja")
CARD_SAMPLING = {"top_k": 20, "top_p": 0.8, "min_p": 0.0}
CHATML = "chatml"
STATIC = str(REPO / "deployments" / "serve" / "webui")

# (command line, the config's parts it must produce: "args" (a subset of the application's
# args), "http" (of http_options), "logging" (logging_config, absent when None))
INVOCATIONS = [
    # Qwen3 card: offload all, flash attention, the card's sampling, 8k context, Jinja
    ("-m {m} -ngl 99 -fa on --top-k 20 --top-p 0.8 --min-p 0 --temp 0.7 -c 8192 --jinja",
     {"args": {"n_ctx": 2048, "temperature": 0.7, "sampling": CARD_SAMPLING}}),
    # Qwen3 thinking mode: the card's other numbers, presence penalty against repetition
    ("-m {m} --temp 0.6 --top-k 20 --top-p 0.95 --min-p 0 --presence-penalty 1.5 -ngl 99",
     {"args": {"temperature": 0.6, "sampling": {"top_k": 20, "top_p": 0.95, "min_p": 0.0,
                                                "presence_penalty": 1.5}}}),
    # Gemma card: repeat penalty and its window
    ("-m {m} --temp 1.0 --top-k 64 --top-p 0.95 --min-p 0.0 --repeat-penalty 1.0 "
     "--repeat-last-n 128",
     {"args": {"temperature": 1.0, "sampling": {"top_k": 64, "top_p": 0.95, "min_p": 0.0,
                                                "repeat_penalty": 1.0,
                                                "repeat_last_n": 128}}}),
    # DRY against loops (a roleplay guide), breakers repeated
    ("-m {m} --dry-multiplier 0.8 --dry-base 1.75 --dry-allowed-length 2 "
     "--dry-penalty-last-n -1 --dry-sequence-breaker . --dry-sequence-breaker !",
     "refused"),
    ("-m {m} --dry-multiplier 0.8 --dry-base 1.75 --dry-allowed-length 2 "
     "--dry-penalty-last-n 1024 --dry-sequence-breaker . --dry-sequence-breaker !",
     {"args": {"sampling": {"dry_multiplier": 0.8, "dry_base": 1.75, "dry_allowed_length": 2,
                            "dry_penalty_last_n": 1024,
                            "dry_sequence_breakers": [".", "!"]}}}),
    ("-m {m} --dry-multiplier 0.5 --dry-sequence-breaker none --dry-base 0.5",
     {"args": {"sampling": {"dry_multiplier": 0.5, "dry_sequence_breakers": []}}}),
    # Mirostat 2 (an older guide), typical sampling, penalties
    ("-m {m} --mirostat 2 --mirostat-lr 0.05 --mirostat-ent 3.0 --typical 0.9 "
     "--frequency-penalty 0.2",
     {"args": {"sampling": {"mirostat": 2, "mirostat_eta": 0.05, "mirostat_tau": 3.0,
                            "typical_p": 0.9, "frequency_penalty": 0.2}}}),
    # a sampler chain by names, then one by letters (the last given wins)
    ("-m {m} --samplers top_k;top_p;min_p;temperature --top-k 40",
     {"args": {"sampling": {"top_k": 40, "samplers": ["top_k", "top_p", "min_p",
                                                      "temperature"]}}}),
    ("-m {m} --samplers top_k;temperature --sampler-seq kt --ignore-eos",
     {"args": {"sampling": {"samplers": "kt", "ignore_eos": True}}}),
    # a benchmark line: ignore EOS, fixed seed, greedy
    ("-m {m} --ignore-eos -s 42 --temp 0 -n 256",
     {"args": {"sampling": {"ignore_eos": True}, "seed": 42, "temperature": 0.0,
               "n_predict": 256}}),
    # CPU only, as the reference's -ngl 0; -dev wins over -ngl
    ("-m {m} -ngl 0 -t 8 -tb 8", {"args": {"device": "cpu"}}),
    ("-m {m} -ngl 99 -dev none", {"args": {"device": "cpu"}}),
    ("-m {m} --n-gpu-layers all -fa auto", {"args": {}, "absent": ["device"]}),
    # a physical batch: the prefill chunk is min(-b, -ub)
    ("-m {m} -b 2048 -ub 512 -c 4096 -np 2",
     {"args": {"n_batch": 512, "n_parallel": 2, "n_ctx": 2048}}),
    ("-m {m} -b 256 -ub 1024", {"args": {"n_batch": 256}}),
    # a production line: host, port, timeout, API key, metrics, HTTP threads
    ("-m {m} --host 0.0.0.0 --port 8081 -to 600 --api-key k --metrics --threads-http 8",
     {"args": {"api_key": "k", "metrics": True},
      "http": {"host": "0.0.0.0", "port": 8081, "request_timeout_s": 600}}),
    # HTTPS on Ray Serve's proxy
    ("-m {m} --host 0.0.0.0 --port 8443 --ssl-key-file /etc/mlxray/key.pem "
     "--ssl-cert-file /etc/mlxray/cert.pem",
     {"args": {}, "http": {"port": 8443, "ssl_keyfile": "/etc/mlxray/key.pem",
                           "ssl_certfile": "/etc/mlxray/cert.pem"}}),
    # a memory line: --mlock --no-mmap
    ("-m {m} --mlock --no-mmap -ngl 99 -c 2048", {"args": {"n_ctx": 512}}),
    # logging: verbose, then disabled (the last wins), a log file, colors
    ("-m {m} -v --log-file {log} --log-colors on",
     {"args": {}, "logging": {"log_level": "DEBUG"}}),
    ("-m {m} -v --log-disable",
     {"args": {}, "logging": {"log_level": "CRITICAL", "enable_access_log": False}}),
    ("-m {m} --log-disable -lv 2",
     {"args": {}, "logging": {"log_level": "WARNING"}}),
    # a chat template by name, by text, by file (the last of the two wins), with kwargs
    ("-m {m} --jinja --chat-template chatml", {"args": {"chat_template": CHATML}}),
    ("-m {m} --chat-template {{{{messages[0].content}}}}",
     {"args": {"chat_template": "{{messages[0].content}}"}}),
    ("-m {m} --chat-template chatml --chat-template-file {t}",
     {"args": {"chat_template_file": TEMPLATE_FILE}, "absent": ["chat_template"]}),
    ("-m {m} --chat-template-kwargs {{\"enable_thinking\":false}} --reasoning-format none",
     {"args": {"chat_template_kwargs": {"enable_thinking": False},
               "reasoning_format": "none"}}),
    # RoPE: a linear stretch of the context, a new base frequency; YaRN over the model's 2048
    ("-m {m} --rope-scaling linear --rope-scale 4 --rope-freq-base 20000 -c 8192",
     {"args": {"config_overrides": {"rope_theta": 20000.0, "rope_scaling": {
         "type": "linear", "factor": 4.0}}}}),
    ("-m {m} --rope-scaling yarn --rope-freq-scale 0.25 --yarn-orig-ctx 2048 "
     "--yarn-beta-fast 32 --yarn-beta-slow 1",
     {"args": {"config_overrides": {"rope_scaling": {
         "type": "yarn", "factor": 4.0, "original_max_position_embeddings": 2048,
         "beta_slow": 1.0, "beta_fast": 32.0}}}}),
    # a long-context card: the KV cache quantized to 8 bits (q4_0 for the tightest memory)
    ("-m {m} -ngl 99 -fa on -ctk q8_0 -ctv q8_0 -c 8192",
     {"args": {"kv_cache_type": "q8_0", "n_ctx": 2048}}),
    ("-m {m} --cache-type-k q4_0 --cache-type-v q4_0 -np 1", {"args": {"kv_cache_type": "q4_0"}}),
    ("-m {m} -ctk f16 -ctv f16", {"args": {}, "absent": ["kv_cache_type"]}),
    # a host short of memory: the prompt cache held to 2 GiB of KV arrays (-1: no limit)
    ("-m {m} -np 4 --cache-ram 2048", {"args": {"cache_ram_mib": 2048, "n_parallel": 4}}),
    ("-m {m} -cram -1", {"args": {"cache_ram_mib": -1}}),
    # the temperature's long spelling and the typical's
    ("-m {m} --temperature 0.3 --typical-p 0.5 --top-nsigma 1.5 --xtc-probability 0.5",
     {"args": {"temperature": 0.3, "sampling": {"typical_p": 0.5, "top_n_sigma": 1.5,
                                                "xtc_probability": 0.5}}}),
    # dynamic temperature, XTC's threshold and the adaptive-p sampler's target and decay
    ("-m {m} --dynatemp-range 0.5 --dynatemp-exp 1.5 --xtc-threshold 0.2 --adaptive-target 0.3 "
     "--adaptive-decay 0.5",
     {"args": {"sampling": {"dynatemp_range": 0.5, "dynatemp_exponent": 1.5,
                            "xtc_threshold": 0.2, "adaptive_target": 0.3,
                            "adaptive_decay": 0.5}}}),
    # a custom UI: the folder's files at / instead of the built-in page
    ("-m {m} --path {p}", {"args": {"static_path": STATIC}}),
]


def dump_config(line: str, capsys: pytest.CaptureFixture, log: str = "") -> dict:
    argv = line.format(m=MODEL, t=TEMPLATE_FILE, log=log, p=STATIC).split() + ["--dump-config"]
    cli.main(argv)
    return yaml.safe_load(capsys.readouterr().out)


@pytest.mark.parametrize("line,expected", INVOCATIONS, ids=[f"{i:02d}" for i in
                                                            range(len(INVOCATIONS))])
def test_invocation_builds_the_config(line, expected, capsys, tmp_path):
    """Each line runs unchanged; the config holds what it asks for."""
    log = str(tmp_path / "server.log")
    if expected == "refused":  # the reference refuses it too (invalid dry-penalty-last-n)
        with pytest.raises(SystemExit) as stopped:
            dump_config(line, capsys, log)
        assert stopped.value.code == 2
        assert "invalid dry-penalty-last-n = -1" in capsys.readouterr().err
        return
    config = dump_config(line, capsys, log)
    ServeDeploySchema.model_validate(config)  # what the command then deploys
    args = config["applications"][0]["args"]
    assert {k: args.get(k) for k in expected["args"]} == expected["args"]
    for key in expected.get("absent", []):
        assert key not in args
    assert {k: config["http_options"].get(k) for k in expected.get("http", {})} == \
        expected.get("http", {})
    assert config.get("logging_config") == expected.get("logging")
    if "sampling" not in expected["args"]:
        assert "sampling" not in args


def test_accepted_options_are_reported(capsys, caplog):
    """-fa, -t, -tb, --threads-http, --mlock and --log-colors change nothing here and say why
    at start; the config is the one without them."""
    plain = dump_config("-m {m}", capsys)
    with caplog.at_level(logging.WARNING, logger="mlxray"):
        config = dump_config("-m {m} -fa off -t 4 -tb 2 --threads-http 3 --mlock "
                             "--log-colors off", capsys)
    assert config == plain
    notes = [r.getMessage() for r in caplog.records if r.name == "mlxray"]
    assert [n.split(":", 1)[0] for n in notes] == [
        "accepted --flash-attn off", "accepted --threads 4", "accepted --threads-batch 2",
        "accepted --threads-http 3", "accepted --mlock", "accepted --log-colors off"]
    assert "fused attention" in notes[0] and "no thread-count setting" in notes[1]


@pytest.mark.parametrize("argv,message", [
    (["-fa", "yes"], "unknown value for --flash-attn: 'yes'"),
    (["--log-colors", "always"], "unknown value for --log-colors: 'always'"),
    (["-ngl", "most"], "invalid value: most"),
    (["--repeat-penalty", "0"], "repeat-penalty must be finite and greater than 0"),
    (["--repeat-last-n", "-2"], "invalid repeat-last-n = -2"),
    (["--presence-penalty", "inf"], "presence-penalty must be finite"),
    (["--chat-template-kwargs", "[1]"], "must be a JSON object"),
    (["--mmap"], "there is no memory-mapped loading"),
])
def test_values_the_reference_refuses(argv, message):
    with pytest.raises(cli.Refused, match=message):
        cli.parse(argv, {})


@pytest.mark.parametrize("flag", ["--ssl-key-file", "--ssl-cert-file"])
def test_one_tls_file_alone_is_refused(flag, capsys):
    """The reference serves plain HTTP then; Ray Serve's proxy would not start: say so."""
    with pytest.raises(SystemExit) as stopped:
        cli.main(["-m", MODEL, flag, "x.pem", "--dump-config"])
    assert stopped.value.code == 2
    assert "HTTPS needs both" in capsys.readouterr().err


def test_rope_options_reach_the_loaded_model():
    """--rope-* land in the config mlx-lm builds the model from: the RoPE of its attention
    layers has the base and scale asked for (YaRN: MLX's YaRN RoPE); --rope-scaling none drops
    the model's scaling; the YaRN factors MLX has no knob for are refused."""
    from engine.model import load_model

    def rope(argv: list[str]):
        graph = cli.graph_args(cli.parse(["-m", MODEL, *argv], {}))
        model = load_model(graph.model_path, None, "cpu", graph.config_overrides).model
        return model.layers[0].self_attn.rope

    plain, linear = rope([]), rope(["--rope-scale", "4", "--rope-freq-base", "20000"])
    assert (plain.base, plain.scale) == (10000.0, 1.0)
    assert (linear.base, linear.scale) == (20000.0, 0.25)
    assert type(rope(["--rope-scaling", "yarn", "--rope-scale", "4"])).__name__ == "YarnRoPE"
    assert cli.graph_args(cli.parse(["--rope-scaling", "none"], {})).config_overrides == {
        "rope_scaling": None}
    with pytest.raises(ValueError, match="need YaRN scaling"):
        cli.graph_args(cli.parse(["--yarn-orig-ctx", "4096"], {}))
    with pytest.raises(cli.Refused, match="--yarn-attn-factor: MLX's YaRN"):
        cli.parse(["--yarn-attn-factor", "1.2"], {})


def test_variables_and_the_chat_template_file(tmp_path):
    """The options' variables, and a template file that cannot be read stops the command."""
    env = {"LLAMA_ARG_TOP_K": "7", "LLAMA_ARG_N_GPU_LAYERS": "0", "LLAMA_ARG_UBATCH": "16",
           "LLAMA_ARG_TIMEOUT": "30", "LLAMA_ARG_CHAT_TEMPLATE": "chatml"}
    config = cli.serve_config(cli.parse([], env))
    args = config["applications"][0]["args"]
    assert (args["sampling"], args["device"], args["n_batch"], args["chat_template"]) == (
        {"top_k": 7}, "cpu", 16, CHATML)
    assert config["http_options"]["request_timeout_s"] == 30
    with pytest.raises(ValueError, match="failed to open file"):
        cli.serve_config(cli.parse(["--chat-template-file", str(tmp_path / "none")], {}))


def test_server_kwargs_are_under_the_requests():
    """--chat-template-kwargs are the template's variables; a request's own win key by key."""
    from deployments.api.tools.request import template_kwargs

    server = {"enable_thinking": False, "style": "terse"}
    assert template_kwargs({}, server) == {"enable_thinking": False, "style": "terse"}
    sent = {"chat_template_kwargs": {"enable_thinking": True}}
    assert template_kwargs(sent, server) == {"enable_thinking": True, "style": "terse"}


# ---- served: the defaults in /props and generation_settings, and their effect --------------
SERVED_LINE = ("-m {m} -np 2 -c 1024 --top-k 1 --top-p 0.8 --min-p 0 --temp 0.9 "
               "--repeat-penalty 1.1 --dry-multiplier 0.5 --dry-sequence-breaker none "
               "--mirostat-lr 0.2 --samplers penalties;dry;top_k;top_p;min_p;temperature "
               "--chat-template chatml --chat-template-kwargs {{\"style\":\"x\"}}")


@pytest.fixture(scope="module")
def served(serve_instance) -> Iterator[str]:
    argv = SERVED_LINE.format(m=MODEL).split()
    args = cli.serve_config(cli.parse(argv, {}))["applications"][0]["args"]
    with dedicated_app(serve_instance, "cli-defaults", args) as base:
        yield base


def test_sampling_defaults_reach_generation_settings(served):
    """The flags' values are /props default_generation_settings and a request's
    generation_settings; a request's own field overrides one; and the defaults steer the
    sampling: with --top-k 1 two random seeds give the greedy text."""
    with httpx.Client(base_url=served, timeout=120) as c:
        props = c.get("/props").json()["default_generation_settings"]["params"]
        prompt = {"prompt": "def fib(n):", "n_predict": 12}
        runs = [c.post("/completion", json={**prompt, "seed": s}).json() for s in (1, 2)]
        greedy = c.post("/completion", json={**prompt, "temperature": 0}).json()
        own = c.post("/completion", json={**prompt, "top_k": 5, "samplers": "kt"}).json()
        template = c.post("/apply-template", json={
            "messages": [{"role": "user", "content": "hi"}]}).json()
    chain = ["penalties", "dry", "top_k", "top_p", "min_p", "temperature"]
    expected = {"top_k": 1, "top_p": pytest.approx(0.8), "min_p": 0.0,
                "temperature": pytest.approx(0.9), "repeat_penalty": pytest.approx(1.1),
                "dry_multiplier": 0.5, "mirostat_eta": pytest.approx(0.2), "samplers": chain}
    for settings in (props, runs[0]["generation_settings"]):
        assert {k: settings[k] for k in expected} == expected
    assert runs[0]["generation_settings"]["dry_sequence_breakers"] == []
    assert runs[0]["content"] == runs[1]["content"] == greedy["content"]
    assert own["generation_settings"]["top_k"] == 5
    assert own["generation_settings"]["samplers"] == ["top_k", "temperature"]
    assert own["generation_settings"]["top_p"] == pytest.approx(0.8)  # the rest stay
    assert template["prompt"] == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


def test_help_lists_the_new_options(capsys):
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    out = capsys.readouterr().out
    for flag in ("--top-k", "--dry-sequence-breaker", "-ngl", "--flash-attn", "-ub",
                 "--chat-template-kwargs", "--log-file"):
        assert flag in out
