"""``mlxray``: llama-server's command line, serving through Ray Serve.

``mlxray -m models/tiny-python --port 8080 -np 2 --api-key k`` builds the Ray Serve config that
``serve run`` would take (``--dump-config`` prints it as YAML) and runs it. llama-server's flags
and ``LLAMA_ARG_*`` environment variables keep their meaning; a flag mlxray does not honor is
refused with a message naming it and saying why, never silently dropped (a switch it honors one
way only, such as ``-cb``, is refused the other way). A flag that changes nothing here because MLX
or Ray Serve already does what it asks (``-fa``, ``-t``, ``--mlock``, ...) is accepted and
reported at start, saying why (deployments/cli/runtime.py). A flag overrides its variable. The
compat manifest's ``option`` entries classify each (docs/llama-server-compat.md).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

import deployments.cli.lora as cli_lora
import deployments.cli.models_dir as cli_models_dir
import deployments.cli.preset as preset
import deployments.cli.rope as cli_rope
import deployments.cli.runtime as cli_runtime
import deployments.cli.sampling as cli_sampling
import deployments.cli.shards as cli_shards
import deployments.cli.template as cli_template
import deployments.cli.url as cli_url
from deployments.api import vertex
from deployments.api.config import APP_WIDE, GraphArgs
from deployments.api.field_parsers import REASONING_FORMATS
from deployments.cli.kv import add_arguments as kv_arguments
from deployments.cli.kv import kv_fields, kv_options
from deployments.cli.launch import GRPC_MESSAGE_ENV, cluster_env_defaults, run
from deployments.cli.options import Option, check_only, check_value, from_env
from deployments.cli.refused import (  # noqa: F401 - the command's table
    REFUSED,
    TENSOR_SPLIT,
    Refused,
    Unhonored,
    refusal,
    refused_env,
    refused_flags,
)
from deployments.cli.speculative import add_arguments as spec_arguments
from deployments.cli.speculative import options as spec_options
from deployments.cli.speculative import spec_fields
from engine import device_choice
from engine.gguf import is_gguf

SEED_RANDOM = 0xFFFFFFFF
CORS_DESTS = ("cors_origins", "cors_methods", "cors_headers", "cors_credentials")
APP_NAME = "mlxray"
AUTO_PARALLEL = 4  # llama-server's -np -1 (its default)


def _reasoning_format(name: str) -> str | None:
    return None if name in REASONING_FORMATS else f"Unknown reasoning format: {name}"


def _reasoning_budget(tokens: int) -> str | None:
    return None if tokens >= -1 else "invalid value"


HONORED: tuple[Option, ...] = (
    Option(("-m", "--model"), "model", "LLAMA_ARG_MODEL",
           help="model folder (MLX / HF layout) or GGUF file"),
    Option(("-hf", "-hfr", "--hf-repo"), "hf_repo", "LLAMA_ARG_HF_REPO",
           help="<user>/<model>[:quant]: a Hugging Face repository as the model (a GGUF one: "
                "the quant's file, Q4_K_M by default); from the hub cache with --dump-config "
                "or HF_HUB_OFFLINE=1; wins over -m"),
    Option(("-hff", "--hf-file"), "hf_file", "LLAMA_ARG_HF_FILE",
           help="the file of the -hf repository to serve (instead of the quant's)"),
    Option(("--offline",), "offline", "LLAMA_ARG_OFFLINE", None,
           "-hf from the hub cache only: nothing is downloaded"),
    Option(("--host",), "host", "LLAMA_ARG_HOST", help="listen address (default 127.0.0.1)"),
    Option(("--port",), "port", "LLAMA_ARG_PORT", int, "listen port (default 8080)"),
    Option(("-np", "--parallel"), "parallel", "LLAMA_ARG_N_PARALLEL", int,
           "slots (default -1: 4)"),
    Option(("-c", "--ctx-size"), "ctx_size", "LLAMA_ARG_CTX_SIZE", int,
           "total context, split across the slots (0: the model's)"),
    Option(("-b", "--batch-size"), "batch_size", "LLAMA_ARG_BATCH", int,
           "prefill chunk in tokens (default 2048)"),
    Option(("-n", "--predict", "--n-predict"), "n_predict", "LLAMA_ARG_N_PREDICT", int,
           "default token limit (-1: none)"),
    Option(("-a", "--alias"), "alias", "LLAMA_ARG_ALIAS",
           help="model name in responses; several, comma-separated: the model answers to each, "
                "the first in sorted order its name"),
    Option(("--tags",), "tags", "LLAMA_ARG_TAGS",
           help="model tags, comma-separated (GET /models' tags; not used for routing)"),
    Option(("--api-key",), "api_key", "LLAMA_API_KEY",
           help="required API key (several: comma-separated)"),
    Option(("--api-key-file",), "api_key_file",
           help="file of API keys, one per line (# starts a comment)"),
    Option(("--metrics",), "metrics", "LLAMA_ARG_ENDPOINT_METRICS", None, "serve /metrics"),
    Option(("--slots",), "slots", "LLAMA_ARG_ENDPOINT_SLOTS", None, "serve /slots (default)",
           negative=("--no-slots",)),
    Option(("--props",), "props", "LLAMA_ARG_ENDPOINT_PROPS", None, "allow POST /props"),
    Option(("--spm-infill",), "spm_infill", None, None,
           "/infill in Suffix/Prefix/Middle order (default: Prefix/Suffix/Middle)"),
    Option(("--temp", "--temperature"), "temp", None, float,
           "default temperature (0.8; <= 0: greedy)"),
    Option(("-s", "--seed"), "seed", None, int, "default seed (-1: random)"),
    Option(("--cache-prompt",), "cache_prompt", "LLAMA_ARG_CACHE_PROMPT", None,
           "default of cache_prompt (on)", negative=("--no-cache-prompt",)),
    Option(("--embedding", "--embeddings"), "embeddings", "LLAMA_ARG_EMBEDDINGS", None,
           "serve the embedding routes"),
    Option(("--pooling",), "pooling", "LLAMA_ARG_POOLING", help="embedding pooling"),
    Option(("--slot-save-path",), "slot_save_path", None,
           help="folder for slot save/restore"),
    Option(("--reasoning-format",), "reasoning_format", "LLAMA_ARG_THINK",
           help="default reasoning_format of a request: none, auto, deepseek (the default), "
                "deepseek-legacy", check=_reasoning_format),
    Option(("--reasoning-budget",), "reasoning_budget", "LLAMA_ARG_THINK_BUDGET", int,
           "default reasoning_budget_tokens of a request: -1 unrestricted (default), 0 end at "
           "once, N tokens", check=_reasoning_budget),
    Option(("--api-prefix",), "api_prefix", "LLAMA_ARG_API_PREFIX",
           help="path prefix of every route (e.g. /llm)"),
    Option(("-dev", "--device"), "device", "LLAMA_ARG_DEVICE", device_choice.from_flag,
           "where the model runs: none (the CPU) or a GPU (CUDA0, MTL0, ...); default: the GPU "
           "where MLX has one", check=device_choice.refusal_here),
    Option(("-cb", "--cont-batching"), "cont_batching", "LLAMA_ARG_CONT_BATCHING", None,
           "continuous batching: always on", negative=("-nocb", "--no-cont-batching"),
           only=True, reason="batching is always continuous"),
    Option(("--jinja",), "jinja", "LLAMA_ARG_JINJA", None, "Jinja chat templates: always on",
           negative=("--no-jinja",), only=True,
           reason="chat templates are always rendered with Jinja"),
    Option(("--context-shift",), "context_shift", "LLAMA_ARG_CONTEXT_SHIFT", None,
           "context shift: always off", negative=("--no-context-shift",), only=False,
           reason="context shift needs KV shifting, which MLX KV caches do not have"),
    Option(("--cors-origins",), "cors_origins", "LLAMA_ARG_CORS_ORIGINS",
           help="allowed CORS origins (default *: the request's Origin echoed; localhost: only a "
                "loopback Origin echoed; else sent as given)"),
    Option(("--cors-methods",), "cors_methods", "LLAMA_ARG_CORS_METHODS",
           help="a preflight's Access-Control-Allow-Methods (default GET, POST, DELETE, OPTIONS)"),
    Option(("--cors-headers",), "cors_headers", "LLAMA_ARG_CORS_HEADERS",
           help="a preflight's Access-Control-Allow-Headers (default *)"),
    Option(("--cors-credentials",), "cors_credentials", "LLAMA_ARG_CORS_CREDENTIALS", None,
           "a preflight's Access-Control-Allow-Credentials (default on)",
           negative=("--no-cors-credentials",)),
    Option(("--ui", "--webui"), "webui", "LLAMA_ARG_WEBUI", None,
           "the web page at / (chat and the graph's status; default on)",
           negative=("--no-ui", "--no-webui")),
    *cli_lora.options(Option),
    *cli_template.options(Option),
    *cli_sampling.options(Option),
    *cli_runtime.options(Option),
    *cli_rope.options(Option), *cli_shards.options(Option), *kv_options(Option),
    *cli_url.options(Option), *cli_models_dir.options(Option), *spec_options(Option),
)


DEFAULTS = {"host": "127.0.0.1", "port": 8080, "parallel": -1, "ctx_size": 0,
            "batch_size": 2048, "n_predict": -1, "temp": 0.8, "seed": -1}


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="mlxray", allow_abbrev=False,
        description="llama-server's HTTP API for MLX models, on Ray Serve.",
        epilog="llama-server flags not listed here are refused, naming them. An option whose "
               "help says 'accepted' changes nothing here and is reported at start, saying why.")
    groups = {name: p.add_argument_group(f"----- {name} params -----") for name in HELP_GROUPS}
    for opt in HONORED:
        _add(groups[help_group(opt.dest)], opt)
    cli_shards.add_arguments(p)
    kv_arguments(p)
    spec_arguments(p)
    p.add_argument("--dump-config", action="store_true",
                   help="print the Ray Serve config (YAML) and exit")
    p.add_argument("--serve-proxy", action="store_true",
                   help="serve HTTP through Ray Serve's proxy rather than from the ingress "
                        "replica itself (Serve's direct ingress, the default on a cluster the "
                        "command starts)")
    return p


def _add(group: argparse._ArgumentGroup, opt: Option) -> None:
    help_text = opt.help + (f" [env {opt.env}]" if opt.env else "")
    if opt.kind is None:  # a switch: its honored spellings shown, the others parsed quietly
        shown = opt.only is not False
        group.add_argument(*opt.flags, dest=opt.dest, action="store_const", const=True,
                           default=None, help=help_text if shown else argparse.SUPPRESS)
        if opt.negative:
            group.add_argument(*opt.negative, dest=opt.dest, action="store_const",
                               const=False, help=argparse.SUPPRESS if shown else help_text)
    else:
        group.add_argument(*opt.flags, dest=opt.dest, type=opt.kind, default=None,
                           action="extend" if opt.repeat else "store", help=help_text)


# llama-server --help's groups: common, sampling, then the server's own ("example-specific")
HELP_GROUPS = ("common", "sampling", "server")
COMMON = {"model", "model_url", "hf_repo", "hf_file", "offline", "verbosity", "ctx_size",
          "batch_size", "ubatch_size", "n_predict", "threads", "threads_batch", "n_gpu_layers",
          "flash_attn", "device", "mlock", "mmap", "verbose", "log_disable", "log_file",
          "log_colors", "lora", "lora_scaled", "context_shift", "cache_type_k", "cache_type_v"}


def help_group(dest: str) -> str:
    if dest in COMMON:
        return "common"
    if dest in cli_sampling.FIELDS or dest in ("temp", "seed", "samplers", "sampler_seq"):
        return "sampling"
    return "server"


def parse(argv: Sequence[str], environ: dict[str, str]) -> argparse.Namespace:
    names = refused_flags(argv) + refused_env(environ)
    if names:
        raise Refused(refusal(names))
    ns = parser().parse_args(list(argv))
    ns.argv, ns.environ = list(argv), environ
    for opt in HONORED:
        from_flag = getattr(ns, opt.dest) is not None
        if not from_flag:
            value = from_env(opt, environ)
            setattr(ns, opt.dest, DEFAULTS.get(opt.dest) if value is None else value)
        check_only(opt, getattr(ns, opt.dest), argv, environ)
        check_value(opt, getattr(ns, opt.dest), argv if from_flag else None)
    # Vertex AI's prediction mode (AIP_MODE=PREDICTION): its routes, and its port over --port
    ns.vertex_routes = vertex.routes_from_env(environ)
    ns.port_given, aip_port = ns.port, vertex.port_from_env(environ)
    ns.port = ns.port if aip_port is None else aip_port
    return ns


def model_context(model_path: str) -> int:
    """The model's training context (llama-server's n_ctx for -c 0), from its config.json."""
    if is_gguf(model_path) and Path(model_path).is_file():
        from engine.gguf.reader import context_length

        return context_length(model_path)
    try:
        config = json.loads((Path(model_path) / "config.json").read_text())
    except (OSError, ValueError):
        return 0
    return int(config.get("max_position_embeddings") or 0)


def graph_args(ns: argparse.Namespace) -> GraphArgs:
    """The application's args. llama-server's -c is the whole context, split across -np slots;
    GraphArgs.n_ctx is one slot's."""
    parallel = AUTO_PARALLEL if ns.parallel == -1 else ns.parallel
    fields: dict[str, Any] = {"n_parallel": parallel, "n_batch": cli_runtime.prefill_chunk(ns),
                              "n_predict": ns.n_predict, "temperature": ns.temp,
                              "seed": SEED_RANDOM if ns.seed == -1 else ns.seed,
                              "metrics": bool(ns.metrics), "props": bool(ns.props),
                              "spm_infill": bool(ns.spm_infill), "batch_size": ns.batch_size,
                              "slots": ns.slots is not False, "cache_prompt": ns.cache_prompt
                              is not False, **names(ns.alias, ns.tags), "api_key": ns.api_key,
                              "api_key_file": cli_runtime.api_key_file(ns),
                              "embeddings": bool(ns.embeddings),
                              "slot_save_path": ns.slot_save_path,
                              "webui": ns.webui is not False}
    fields.update({k: getattr(ns, k) for k in CORS_DESTS if getattr(ns, k) is not None})
    if ns.pooling is not None:
        fields["pooling"] = ns.pooling
    if ns.reasoning_format is not None:
        fields["reasoning_format"] = ns.reasoning_format
    if ns.reasoning_budget is not None:
        fields["reasoning_budget_tokens"] = ns.reasoning_budget
    if cli_runtime.device(ns) is not None:
        fields["device"] = cli_runtime.device(ns)
    fields.update(cli_url.model_fields(ns))
    fields.update(cli_lora.lora_fields(ns, ns.argv))
    fields.update(cli_url.static_fields(ns))
    fields.update(getattr(ns, "vertex_routes", {}))
    fields.update(cli_shards.shard_fields(ns))
    fields.update(cli_template.template_fields(ns))
    fields.update(kv_fields(ns))
    fields.update(spec_fields(ns))
    fields.update(cli_models_dir.router_fields(ns))
    sampling = cli_sampling.sampling_fields(ns, ns.argv)
    if sampling:
        fields["sampling"] = sampling
    router = cli_models_dir.models_fields(ns, lambda head: _router_entry(ns, head),
                                          preset_keys)
    if router:  # each model's own settings, -c's split made per model
        return GraphArgs.model_validate({**fields, **router})
    # --dump-config with -mu: the file is not downloaded, its path is shown all the same
    pending = {"model_pending": bool(ns.model_url and ns.dump_config)}
    probe = GraphArgs.model_validate({k: v for k, v in fields.items() if k == "model"},
                                     context=pending)
    overrides = cli_rope.model_config(ns, probe.model_path)
    if overrides:
        fields["config_overrides"] = overrides
    total = ns.ctx_size or model_context(probe.model_path)
    if total and parallel >= 1:
        if total // parallel < 8:
            raise Refused(f"-c {total} leaves {total // parallel} tokens per slot for "
                          f"-np {parallel}")
        fields["n_ctx"] = total // parallel
    return GraphArgs.model_validate(fields, context=pending)


# an application's settings, never one router-mode model's
NOT_PER_MODEL = {*APP_WIDE, "models", "models_dir", "models_preset", "models_max",
                 "models_autoload", "alias", "aliases"}


def _router_entry(ns: argparse.Namespace, head: list[str]) -> dict[str, Any]:
    """One router-mode model's ``models`` entry: the command as if run for that model alone,
    its arguments ``head`` (its file and preset sections) under the command line's own."""
    argv = [*head, *cli_models_dir.without_router_flags(ns.argv)]
    model_ns = parse(argv, ns.environ)
    model_ns.models_dir = model_ns.models_preset = None
    graph = graph_args(model_ns)
    entry = {k: v for k, v in graph.model_dump(exclude_defaults=True).items()
             if k not in NOT_PER_MODEL}
    return {**entry, "model": graph.model, "n_ctx": graph.n_ctx}


def names(alias: str | None, tags: str | None) -> dict[str, Any]:
    """-a's names (the reference keeps them in a sorted set: the first is the model's name, the
    others its aliases) and --tags'."""
    split = lambda text: sorted({p.strip() for p in (text or "").split(",") if p.strip()})  # noqa: E731
    aliases, labels = split(alias), split(tags)
    out: dict[str, Any] = {"alias": aliases[0] if aliases else None}
    if aliases[1:]:
        out["aliases"] = tuple(aliases[1:])
    if labels:
        out["tags"] = tuple(labels)
    return out


def preset_keys() -> dict[str, preset.Spelling]:
    """Every key a --models-preset section may use: the command's flags and variables."""
    return preset.spellings(parser(), {o.env: o.flags[-1] for o in HONORED if o.env})


# what the shipped configs set (configs/local.yaml): user code and the handle router on each
# replica's own event loop, and gRPC messages up to gRPC's 2 GiB (launch.GRPC_MESSAGE_ENV)
REPLICA_LOOP_ENV = {"env_vars": {"RAY_SERVE_RUN_USER_CODE_IN_SEPARATE_THREAD": "0",
                                 "RAY_SERVE_RUN_ROUTER_IN_SEPARATE_LOOP": "0",
                                 **GRPC_MESSAGE_ENV}}


def serve_config(ns: argparse.Namespace) -> dict:
    """The config ``serve run`` takes: one application, the graph of deployments/serve/graph.py."""
    graph = graph_args(ns)
    sizes = {"model": graph.model, "n_parallel": graph.n_parallel, "n_ctx": graph.n_ctx,
             "n_batch": graph.n_batch}
    args = {**sizes, **graph.model_dump(exclude_defaults=True)}
    logging = cli_runtime.logging_config(ns)
    return {
        "proxy_location": "HeadOnly",
        "http_options": {"host": ns.host, "port": ns.port, **cli_runtime.http_options(ns)},
        **({"logging_config": logging} if logging else {}),
        "applications": [{
            "name": APP_NAME,
            "route_prefix": cli_runtime.route_prefix(ns),
            "import_path": "deployments.serve.graph:build_app",
            "runtime_env": REPLICA_LOOP_ENV,
            "args": args,
            "deployments": [
                {"name": "Ingress", "ray_actor_options": {"num_cpus": 0.1}},
                *cli_models_dir.model_deployments(graph),
            ],
        }],
    }


def main(argv: Sequence[str] | None = None) -> None:
    cluster_env_defaults()
    try:
        ns = parse(sys.argv[1:] if argv is None else argv, dict(os.environ))
        config = serve_config(ns)
    except (Refused, ValueError) as exc:
        parser().exit(2, f"mlxray: error: {exc}\n")
    cli_runtime.configure_logging(ns)
    for note in cli_runtime.notes(ns, HONORED):
        logging.getLogger("mlxray").warning("accepted %s", note)
    if ns.port != ns.port_given:
        logging.getLogger("mlxray").warning("Google Cloud Platform compat: overriding server "
                                            "port %d with AIP_HTTP_PORT %d", ns.port_given, ns.port)
    if ns.dump_config:
        yaml.safe_dump(config, sys.stdout, sort_keys=False)
        return
    run(config, ns.serve_proxy)  # until SIGTERM or SIGINT, then the process ends (launch.py)


if __name__ == "__main__":
    main()
