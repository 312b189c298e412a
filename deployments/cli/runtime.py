"""llama-server's options about where and how the server runs, each with its meaning on MLX and
Ray Serve: ``-ngl`` picks the device, ``-ub`` caps the prefill chunk, ``-to`` is Ray Serve's
request timeout, ``--ssl-key-file``/``--ssl-cert-file`` its proxy's HTTPS,
``-v``/``--log-disable``/``--log-file`` set the logging; ``-fa``, ``-t``, ``-tb``,
``--threads-http``, ``--mlock`` and ``--log-colors`` are accepted and reported at start
(a ``note``), because MLX or Ray Serve already does what they ask or has no such setting.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from deployments.cli.refused import Refused

TRUTHY = ("on", "enabled", "true", "1")
FALSEY = ("off", "disabled", "false", "0")
AUTOY = ("auto", "-1")
MMAP = ("mlx-lm reads the weights into MLX's own buffers with mx.load: there is no memory-mapped "
        "loading; --no-mmap is what it always does")

NOTES = {
    "flash_attn": "MLX always runs its fused attention kernel "
                  "(mx.fast.scaled_dot_product_attention): there is no switch",
    "threads": "MLX has no thread-count setting (it schedules its own CPU threads; the GPU "
               "does the compute): the value is not used",
    "threads_batch": "MLX has no thread-count setting: the value is not used",
    "threads_http": "Ray Serve's HTTP proxy and the ingress are asyncio servers, without an "
                    "HTTP thread pool: the value is not used",
    "mlock": "on Apple silicon the engine always raises MLX's wired-memory limit to Metal's "
             "recommended working set, which keeps the model resident; elsewhere MLX locks "
             "nothing",
    "log_colors": "the logs are Ray's and the command's plain lines: there are no colors",
}


def _on_off_auto(flag: str) -> Any:
    def check(value: str) -> str | None:
        if value in TRUTHY + FALSEY + AUTOY:
            return None
        return f"error: unknown value for {flag}: '{value}'"
    return check


def _gpu_layers(value: str) -> str | None:
    if value in ("auto", "all"):
        return None
    try:
        int(value)
    except ValueError:
        return f"invalid value: {value} (a number of layers, auto or all)"
    return None


def options(option: type) -> tuple:
    """The options, as ``option`` (the command's Option class) describes them."""
    o = option
    return (
        o(("-ngl", "--gpu-layers", "--n-gpu-layers"), "n_gpu_layers", "LLAMA_ARG_N_GPU_LAYERS",
          str, "0: the model runs on the CPU; any other value (N, auto, all): on the GPU, the "
          "whole model (-dev wins)", check=_gpu_layers),
        o(("-fa", "--flash-attn"), "flash_attn", "LLAMA_ARG_FLASH_ATTN", str,
          "[on|off|auto] accepted: MLX always uses its fused attention",
          check=_on_off_auto("--flash-attn")),
        o(("-t", "--threads"), "threads", "LLAMA_ARG_THREADS", int,
          "accepted and reported: MLX has no thread setting"),
        o(("-tb", "--threads-batch"), "threads_batch", "LLAMA_ARG_THREADS_BATCH", int,
          "accepted and reported: MLX has no thread setting"),
        o(("--threads-http",), "threads_http", "LLAMA_ARG_THREADS_HTTP", int,
          "accepted and reported: Ray Serve's proxy is asynchronous"),
        o(("-ub", "--ubatch-size"), "ubatch_size", "LLAMA_ARG_UBATCH", int,
          "physical batch: the prefill chunk is min(-b, -ub)"),
        o(("-to", "--timeout"), "timeout", "LLAMA_ARG_TIMEOUT", int,
          "Ray Serve's request timeout in seconds (http_options.request_timeout_s: the whole "
          "request, not a socket read/write)"),
        o(("--ssl-key-file",), "ssl_key_file", "LLAMA_ARG_SSL_KEY_FILE", str,
          "PEM private key: HTTPS with --ssl-cert-file (Ray Serve's http_options.ssl_keyfile)"),
        o(("--ssl-cert-file",), "ssl_cert_file", "LLAMA_ARG_SSL_CERT_FILE", str,
          "PEM certificate: HTTPS with --ssl-key-file (Ray Serve's http_options.ssl_certfile)"),
        o(("--mlock",), "mlock", "LLAMA_ARG_MLOCK", None,
          "accepted: on Apple silicon the model's memory is always wired"),
        o(("--mmap",), "mmap", "LLAMA_ARG_MMAP", None,
          "weights are always read, not mapped: --no-mmap is accepted, --mmap refused",
          negative=("--no-mmap",), only=False, reason=MMAP),
        o(("-v", "--verbose", "--log-verbose"), "verbose", None, None,
          "log everything: Ray Serve's and the command's log level DEBUG"),
        o(("-lv", "--verbosity", "--log-verbosity"), "verbosity", "LLAMA_ARG_LOG_VERBOSITY", int,
          "log threshold: 0-1 errors, 2 warnings, 3 info, 4-5 debug (Ray Serve's and the "
          "command's log level)"),
        o(("--log-disable",), "log_disable", None, None,
          "log only critical failures: Ray Serve's log level CRITICAL, no access log"),
        o(("--log-file",), "log_file", "LLAMA_ARG_LOG_FILE", str,
          "the command's log lines go to this file too (replicas log in Ray's session folder)"),
        o(("--log-colors",), "log_colors", "LLAMA_ARG_LOG_COLORS", str,
          "[on|off|auto] accepted: the logs have no colors", check=_on_off_auto("--log-colors")),
    )


def device(ns: Any) -> str | None:
    """-dev when given, else -ngl 0: the CPU; else None (the default device)."""
    if ns.device is not None:
        return ns.device
    if ns.n_gpu_layers is not None and ns.n_gpu_layers not in ("auto", "all"):
        return "cpu" if int(ns.n_gpu_layers) == 0 else None
    return None


def prefill_chunk(ns: Any) -> int:
    """llama.cpp evaluates a prompt in physical batches of at most -ub tokens within each
    logical batch of -b: MLX's prefill chunk is the smaller."""
    return ns.batch_size if ns.ubatch_size is None else min(ns.batch_size, ns.ubatch_size)


def http_options(ns: Any) -> dict[str, Any]:
    """Ray Serve's proxy settings: the request timeout, HTTPS (both files, or neither: the
    reference then serves plain HTTP, Ray Serve refuses to start)."""
    options: dict[str, Any] = {} if ns.timeout is None else {"request_timeout_s": ns.timeout}
    key, cert = ns.ssl_key_file, ns.ssl_cert_file
    if bool(key) != bool(cert):
        given, missing = ("--ssl-key-file", "--ssl-cert-file") if key else (
            "--ssl-cert-file", "--ssl-key-file")
        raise ValueError(f"{given} without {missing}: HTTPS needs both (Ray Serve's proxy "
                         "starts with both or neither)")
    if key:
        options.update(ssl_keyfile=key, ssl_certfile=cert)
    return options


VERBOSITY_FLAGS = ("-lv", "--verbosity", "--log-verbosity")
LEVELS = ("ERROR", "ERROR", "WARNING", "INFO", "DEBUG")  # llama.cpp's verbosity 0..4, 5+: DEBUG


def logging_config(ns: Any) -> dict[str, Any]:
    """Ray Serve's logging_config (every deployment and the proxy): -v DEBUG, -lv N its level,
    --log-disable CRITICAL without the access log; the last given wins, as the reference's."""
    last = last_of(ns.argv, ("-v", "--verbose", "--log-verbose", "--log-disable",
                             *VERBOSITY_FLAGS))
    if last is None and ns.verbosity is not None:
        last = "-lv"  # from LLAMA_ARG_LOG_VERBOSITY
    if last is None:
        return {}
    if last == "--log-disable":
        return {"log_level": "CRITICAL", "enable_access_log": False}
    if last in VERBOSITY_FLAGS:
        return {"log_level": LEVELS[min(max(ns.verbosity, 0), len(LEVELS) - 1)]}
    return {"log_level": "DEBUG"}


def last_of(argv: list[str], flags: tuple[str, ...]) -> str | None:
    given = [a.split("=", 1)[0] for a in argv if a.split("=", 1)[0] in flags]
    return given[-1] if given else None


def notes(ns: Any, honored: tuple) -> list[str]:
    """What the command reports at start for each accepted option that changes nothing here."""
    out = []
    for opt in honored:
        value = getattr(ns, opt.dest, None)
        if opt.dest in NOTES and value not in (None, False):
            shown = "" if opt.kind is None else f" {value}"
            out.append(f"{opt.flags[-1]}{shown}: {NOTES[opt.dest]}")
    return out


def configure_logging(ns: Any) -> None:
    """The command's own logger ("mlxray"): its level (-v, --log-disable) and --log-file, set
    again on each call (handlers of an earlier call are closed)."""
    log = logging.getLogger("mlxray")
    for handler in [h for h in log.handlers if getattr(h, "mlxray", False)]:
        log.removeHandler(handler)
        handler.close()
    handlers: list[logging.Handler] = [logging.StreamHandler()]
    if ns.log_file:
        handlers.append(logging.FileHandler(ns.log_file))
    for handler in handlers:
        handler.mlxray = True  # type: ignore[attr-defined]
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        log.addHandler(handler)
    log.setLevel(logging_config(ns).get("log_level", "INFO"))


def api_key_file(ns: Any) -> str | None:
    """--api-key-file as an absolute path the ingress reads at start (the keys themselves stay
    out of the serve config, ``serve config`` and the dashboard); a file that cannot be read
    stops the command, as llama-server's "failed to open file"."""
    if not ns.api_key_file:
        return None
    path = Path(ns.api_key_file).resolve()
    try:
        path.read_text()
    except OSError as exc:
        raise Refused(f"--api-key-file: failed to open file '{ns.api_key_file}': "
                      f"{exc}") from None
    return str(path)


def route_prefix(ns: Any) -> str:
    """--api-prefix as Ray Serve's route prefix (``/`` without one)."""
    prefix = (ns.api_prefix or "").rstrip("/")
    if prefix and not prefix.startswith("/"):
        raise Refused(f"--api-prefix {ns.api_prefix!r} must start with /")
    return prefix or "/"
