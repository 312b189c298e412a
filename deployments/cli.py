"""``mlxray``: llama-server's command line, serving through Ray Serve.

``mlxray -m models/tiny-python --port 8080 -np 2 --api-key k`` builds the Ray Serve config that
``serve run`` would take (``--dump-config`` prints it as YAML) and runs it. llama-server's flags
and ``LLAMA_ARG_*`` environment variables keep their meaning; a flag mlxray does not honor is
refused with a message naming it, never silently dropped. A flag overrides its variable.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from .config import GraphArgs

SEED_RANDOM = 0xFFFFFFFF
APP_NAME = "mlxray"
AUTO_PARALLEL = 4  # llama-server's -np -1 (its default)


@dataclass(frozen=True)
class Option:
    """One honored llama-server option: its flags, its environment variable, where it lands."""

    flags: tuple[str, ...]
    dest: str
    env: str | None = None
    kind: Callable[[str], Any] | None = str
    help: str = ""
    negative: tuple[str, ...] = ()  # --no-X flags of a boolean option


def _bool_env(value: str) -> bool:
    """llama-server's reading of a boolean variable."""
    return value.strip().lower() in ("1", "true", "on", "enabled", "yes")


HONORED: tuple[Option, ...] = (
    Option(("-m", "--model"), "model", "LLAMA_ARG_MODEL", help="model folder (MLX / HF layout)"),
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
    Option(("-a", "--alias"), "alias", "LLAMA_ARG_ALIAS", help="model name in responses"),
    Option(("--api-key",), "api_key", "LLAMA_API_KEY", help="required API key"),
    Option(("--metrics",), "metrics", "LLAMA_ARG_ENDPOINT_METRICS", None, "serve /metrics"),
    Option(("--slots",), "slots", "LLAMA_ARG_ENDPOINT_SLOTS", None, "serve /slots (default)",
           negative=("--no-slots",)),
    Option(("--props",), "props", "LLAMA_ARG_ENDPOINT_PROPS", None, "allow POST /props"),
    Option(("--temp",), "temp", None, float, "default temperature (0.8)"),
    Option(("-s", "--seed"), "seed", None, int, "default seed (-1: random)"),
    Option(("--cache-prompt",), "cache_prompt", "LLAMA_ARG_CACHE_PROMPT", None,
           "default of cache_prompt (on)", negative=("--no-cache-prompt",)),
    Option(("--embedding", "--embeddings"), "embeddings", "LLAMA_ARG_EMBEDDINGS", None,
           "serve the embedding routes"),
    Option(("--pooling",), "pooling", "LLAMA_ARG_POOLING", help="embedding pooling"),
    Option(("--slot-save-path",), "slot_save_path", None,
           help="folder for slot save/restore"),
    Option(("-cb", "--cont-batching"), "cont_batching", "LLAMA_ARG_CONT_BATCHING", None,
           "continuous batching: always on", negative=("-nocb", "--no-cont-batching")),
)

# llama-server options mlxray knows and does not honor: (flags, environment variable).
REFUSED: tuple[tuple[tuple[str, ...], str | None], ...] = (
    (("--chat-template",), "LLAMA_ARG_CHAT_TEMPLATE"),
    (("--chat-template-file",), "LLAMA_ARG_CHAT_TEMPLATE_FILE"),
    (("--jinja", "--no-jinja"), "LLAMA_ARG_JINJA"),
    (("-ub", "--ubatch-size"), "LLAMA_ARG_UBATCH"),
    (("-t", "--threads"), "LLAMA_ARG_THREADS"),
    (("-tb", "--threads-batch"), "LLAMA_ARG_THREADS_BATCH"),
    (("--threads-http",), "LLAMA_ARG_THREADS_HTTP"),
    (("-ngl", "--gpu-layers", "--n-gpu-layers"), "LLAMA_ARG_N_GPU_LAYERS"),
    (("-fa", "--flash-attn"), "LLAMA_ARG_FLASH_ATTN"),
    (("-ctk", "--cache-type-k"), "LLAMA_ARG_CACHE_TYPE_K"),
    (("-ctv", "--cache-type-v"), "LLAMA_ARG_CACHE_TYPE_V"),
    (("-kvu", "--kv-unified", "-no-kvu", "--no-kv-unified"), "LLAMA_ARG_KV_UNIFIED"),
    (("--cache-reuse",), "LLAMA_ARG_CACHE_REUSE"),
    (("-cram", "--cache-ram"), "LLAMA_ARG_CACHE_RAM"),
    (("--context-shift", "--no-context-shift"), "LLAMA_ARG_CONTEXT_SHIFT"),
    (("-to", "--timeout"), "LLAMA_ARG_TIMEOUT"),
    (("--mlock",), "LLAMA_ARG_MLOCK"),
    (("--no-mmap", "--mmap"), "LLAMA_ARG_MMAP"),
    (("-hf", "-hfr", "--hf-repo"), "LLAMA_ARG_HF_REPO"),
    (("-mu", "--model-url"), "LLAMA_ARG_MODEL_URL"),
    (("--lora",), None),
    (("-mm", "--mmproj"), "LLAMA_ARG_MMPROJ"),
    (("-md", "--model-draft"), "LLAMA_ARG_MODEL_DRAFT"),
    (("--rerank", "--reranking"), "LLAMA_ARG_RERANKING"),
    (("--api-key-file",), None),
    (("--ssl-key-file",), "LLAMA_ARG_SSL_KEY_FILE"),
    (("--ssl-cert-file",), "LLAMA_ARG_SSL_CERT_FILE"),
    (("--path",), "LLAMA_ARG_STATIC_PATH"),
    (("--api-prefix",), "LLAMA_ARG_API_PREFIX"),
    (("--no-webui", "--webui"), "LLAMA_ARG_WEBUI"),
    (("--rope-scaling",), "LLAMA_ARG_ROPE_SCALING_TYPE"),
    (("--rope-freq-base",), "LLAMA_ARG_ROPE_FREQ_BASE"),
    (("--rope-freq-scale",), "LLAMA_ARG_ROPE_FREQ_SCALE"),
    (("-dev", "--device"), "LLAMA_ARG_DEVICE"),
    (("-sm", "--split-mode"), "LLAMA_ARG_SPLIT_MODE"),
    (("-ts", "--tensor-split"), "LLAMA_ARG_TENSOR_SPLIT"),
    (("-mg", "--main-gpu"), "LLAMA_ARG_MAIN_GPU"),
    (("--numa",), "LLAMA_ARG_NUMA"),
    (("--slot-prompt-similarity", "-sps"), None),
    (("--reasoning-format",), "LLAMA_ARG_THINK"),
    (("--reasoning-budget",), "LLAMA_ARG_THINK_BUDGET"),
    (("--models-dir",), "LLAMA_ARG_MODELS_DIR"),
    (("--top-k",), None), (("--top-p",), None), (("--min-p",), None),
    (("--repeat-penalty",), None), (("--samplers",), None),
    (("-v", "--verbose", "--log-verbose"), None),
    (("--log-disable",), None), (("--log-file",), None),
)

DEFAULTS = {"host": "127.0.0.1", "port": 8080, "parallel": -1, "ctx_size": 0,
            "batch_size": 2048, "n_predict": -1, "temp": 0.8, "seed": -1}


class Refused(Exception):
    """A command line mlxray will not run; ``main`` prints it and exits with status 2, as
    argparse does for its own usage errors."""


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="mlxray", allow_abbrev=False,
        description="llama-server's HTTP API for MLX models, on Ray Serve.",
        epilog="llama-server flags not listed here are refused, naming them.")
    for opt in HONORED:
        help_text = opt.help + (f" [env {opt.env}]" if opt.env else "")
        if opt.kind is None:
            p.add_argument(*opt.flags, dest=opt.dest, action="store_const", const=True,
                           default=None, help=help_text)
            if opt.negative:
                p.add_argument(*opt.negative, dest=opt.dest, action="store_const",
                               const=False, help=argparse.SUPPRESS)
        else:
            p.add_argument(*opt.flags, dest=opt.dest, type=opt.kind, default=None,
                           help=help_text)
    p.add_argument("--dump-config", action="store_true",
                   help="print the Ray Serve config (YAML) and exit")
    return p


def refused_flags(argv: Sequence[str]) -> list[str]:
    known = {flag for flags, _ in REFUSED for flag in flags}
    return [a.split("=", 1)[0] for a in argv if a.split("=", 1)[0] in known]


def refused_env(environ: dict[str, str]) -> list[str]:
    return [env for _, env in REFUSED if env and env in environ]


def _from_env(opt: Option, environ: dict[str, str]) -> Any:
    raw = environ.get(opt.env) if opt.env else None
    if raw is None:
        return None
    if opt.kind is None:
        return _bool_env(raw)
    try:
        return opt.kind(raw)
    except ValueError:
        raise Refused(f"{opt.env}={raw!r} is not a valid {opt.flags[-1]}") from None


def parse(argv: Sequence[str], environ: dict[str, str]) -> argparse.Namespace:
    flags, env = refused_flags(argv), refused_env(environ)
    if flags or env:
        names = ", ".join(flags + env)
        raise Refused(f"mlxray does not honor these llama-server options: {names} "
                      "(see docs/llama-server-compat.md)")
    ns = parser().parse_args(list(argv))
    for opt in HONORED:
        if getattr(ns, opt.dest) is None:
            value = _from_env(opt, environ)
            setattr(ns, opt.dest, DEFAULTS.get(opt.dest) if value is None else value)
    if ns.cont_batching is False:
        raise Refused("mlxray does not honor --no-cont-batching: batching is always continuous")
    return ns


def model_context(model_path: str) -> int:
    """The model's training context (llama-server's n_ctx for -c 0), from its config.json."""
    try:
        config = json.loads((Path(model_path) / "config.json").read_text())
    except (OSError, ValueError):
        return 0
    return int(config.get("max_position_embeddings") or 0)


def graph_args(ns: argparse.Namespace) -> GraphArgs:
    """The application's args. llama-server's -c is the whole context, split across -np slots;
    GraphArgs.n_ctx is one slot's."""
    parallel = AUTO_PARALLEL if ns.parallel == -1 else ns.parallel
    fields: dict[str, Any] = {"n_parallel": parallel, "n_batch": ns.batch_size,
                              "n_predict": ns.n_predict, "temperature": ns.temp,
                              "seed": SEED_RANDOM if ns.seed == -1 else ns.seed,
                              "metrics": bool(ns.metrics), "props": bool(ns.props),
                              "slots": ns.slots is not False, "cache_prompt": ns.cache_prompt
                              is not False, "alias": ns.alias, "api_key": ns.api_key,
                              "embeddings": bool(ns.embeddings),
                              "slot_save_path": ns.slot_save_path}
    if ns.pooling is not None:
        fields["pooling"] = ns.pooling
    if ns.model:
        fields["model"] = str(Path(ns.model).resolve()) if Path(ns.model).is_dir() else ns.model
    probe = GraphArgs.model_validate({k: v for k, v in fields.items() if k == "model"})
    total = ns.ctx_size or model_context(probe.model_path)
    if total and parallel >= 1:
        if total // parallel < 8:
            raise Refused(f"-c {total} leaves {total // parallel} tokens per slot for "
                          f"-np {parallel}")
        fields["n_ctx"] = total // parallel
    return GraphArgs.model_validate(fields)


def serve_config(ns: argparse.Namespace) -> dict:
    """The config ``serve run`` takes: one application, the graph of deployments/graph.py."""
    graph = graph_args(ns)
    sizes = {"model": graph.model, "n_parallel": graph.n_parallel, "n_ctx": graph.n_ctx,
             "n_batch": graph.n_batch}
    args = {**sizes, **graph.model_dump(exclude_defaults=True)}
    return {
        "proxy_location": "HeadOnly",
        "http_options": {"host": ns.host, "port": ns.port},
        "applications": [{
            "name": APP_NAME,
            "route_prefix": "/",
            "import_path": "deployments.graph:build_app",
            "args": args,
            "deployments": [
                {"name": "Ingress", "ray_actor_options": {"num_cpus": 0.1}},
                {"name": "ResponseShaper", "ray_actor_options": {"num_cpus": 0.1}},
                {"name": "ModelReplica", "max_ongoing_requests": 16 * args.get("n_parallel", 4),
                 "ray_actor_options": {"num_cpus": 0.5}},
            ],
        }],
    }


def run(config: dict) -> None:
    """What ``serve run`` does with a config file, then block until SIGINT/SIGTERM. Without
    RAY_ADDRESS it starts its own local Ray cluster, as llama-server owns its process."""
    import ray
    from ray import serve
    from ray.serve._private import api as serve_api
    from ray.serve._private.constants import SERVE_NAMESPACE
    from ray.serve.config import gRPCOptions
    from ray.serve.schema import ApplicationStatus, ServeDeploySchema

    schema = ServeDeploySchema.model_validate(config)
    ray.init(address=os.environ.get("RAY_ADDRESS") or "local", namespace=SERVE_NAMESPACE)
    client = serve_api.serve_start(http_options=schema.http_options.model_dump(),
                                   proxy_location=schema.proxy_location,
                                   grpc_options=gRPCOptions(**schema.grpc_options.model_dump()))
    stopping = False

    def stop(*_: Any) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    try:
        client.deploy_apps(schema, _blocking=False)
        announced = False
        while not stopping:
            state = serve.status().applications.get(APP_NAME)
            if state is not None and state.status == ApplicationStatus.DEPLOY_FAILED:
                raise Refused(f"the application failed to deploy: {state.message}")
            if not announced and state is not None and state.status == ApplicationStatus.RUNNING:
                host, port = config["http_options"]["host"], config["http_options"]["port"]
                print(f"mlxray: serving on http://{host}:{port}", file=sys.stderr, flush=True)
                announced = True
            time.sleep(0.5)
    finally:
        serve.shutdown()
        ray.shutdown()


def main(argv: Sequence[str] | None = None) -> None:
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    try:
        ns = parse(sys.argv[1:] if argv is None else argv, dict(os.environ))
        config = serve_config(ns)
    except (Refused, ValueError) as exc:
        parser().exit(2, f"mlxray: error: {exc}\n")
    if ns.dump_config:
        yaml.safe_dump(config, sys.stdout, sort_keys=False)
        return
    try:
        run(config)
    except Refused as exc:
        parser().exit(1, f"mlxray: error: {exc}\n")


if __name__ == "__main__":
    main()
