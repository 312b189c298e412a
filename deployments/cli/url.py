"""llama-server's ``-mu/--model-url`` (a model file fetched over HTTP at start) and ``--path``
(static files served at / instead of the built-in web page).

``-mu`` downloads the file into ``$LLAMA_CACHE``, else ``~/.cache/mlxray/`` (the reference's
cache is ``~/.cache/llama.cpp/``), under the URL's last path segment, or to ``-m`` when given
(as the reference's); the command does it before deploying, so every replica reads a local
file. A file already there with the size the server reports is reused. ``--dump-config``
downloads nothing: it shows the path the file will have."""

from __future__ import annotations

import argparse
import os
import shutil
import urllib.request
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

from deployments.cli import hf as cli_hf

TIMEOUT_S = 60


def options(option: type) -> tuple:
    """The options, as ``option`` (the command's Option class) describes them."""
    return (
        option(("-mu", "--model-url"), "model_url", "LLAMA_ARG_MODEL_URL",
               help="model file URL, downloaded at start into $LLAMA_CACHE or ~/.cache/mlxray/ "
                    "(or to -m), reused when there with the same size; -hf wins"),
        option(("--path",), "static_path", "LLAMA_ARG_STATIC_PATH",
               help="folder of static files served at / instead of the built-in web page"),
    )


def model_fields(ns: argparse.Namespace) -> dict[str, Any]:
    """The model the command names: -hf wins over -mu, which wins over -m (-mu's destination
    then)."""
    if ns.hf_repo:
        return {"model": cli_hf.model(ns.hf_repo, not (ns.dump_config or ns.offline),
                                      ns.hf_file)}
    if ns.model_url:
        return {"model": model(ns.model_url, ns.model, not ns.dump_config, dict(os.environ))}
    if ns.model:
        return {"model": str(Path(ns.model).resolve()) if Path(ns.model).exists() else ns.model}
    return {}


def cache_dir(environ: dict[str, str]) -> Path:
    return Path(environ.get("LLAMA_CACHE") or Path.home() / ".cache" / "mlxray").expanduser()


def local_path(url: str, dest: str | None, environ: dict[str, str]) -> Path:
    """Where the URL's file lands: ``dest`` (-m), else the cache under the URL's file name."""
    if dest:
        return Path(dest).resolve()
    name = unquote(urlsplit(url).path.rstrip("/").rsplit("/", 1)[-1])
    if not name or name in (".", ".."):
        raise ValueError(f"--model-url {url}: the URL names no file")
    cache = cache_dir(environ).resolve()
    path = (cache / name).resolve()
    # a percent-encoded separator (..%2F..%2F) decodes into a path that leaves the cache
    if "/" in name or "\\" in name or path.parent != cache:
        raise ValueError(f"--model-url {url}: the URL's file name leaves the cache folder")
    return path


def model(url: str, dest: str | None, download: bool, environ: dict[str, str]) -> str:
    """The model's local path; the file is fetched first when ``download`` (not for
    --dump-config) unless the same size is already there."""
    if urlsplit(url).scheme not in ("http", "https"):
        raise ValueError(f"--model-url {url}: expected an http(s) URL")
    path = local_path(url, dest, environ)
    if download:
        fetch(url, path)
    return str(path)


def fetch(url: str, path: Path) -> None:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, method="HEAD"),
                                    timeout=TIMEOUT_S) as head:
            size = head.headers.get("Content-Length")
        if size is not None and path.is_file() and path.stat().st_size == int(size):
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(path.name + ".downloadInProgress")
        with urllib.request.urlopen(url, timeout=TIMEOUT_S) as body, partial.open("wb") as out:
            shutil.copyfileobj(body, out, 1 << 20)
        os.replace(partial, path)
    except OSError as exc:  # URLError and HTTPError are OSErrors
        raise ValueError(f"--model-url {url}: download failed: {exc}") from None


def static_fields(ns: argparse.Namespace) -> dict[str, Any]:
    """--path as an absolute folder; one that is not a folder stops the command, as the
    reference's "static assets path not found"."""
    if not ns.static_path:
        return {}
    folder = Path(ns.static_path).resolve()
    if not folder.is_dir():
        raise ValueError(f"--path: static assets path not found: {ns.static_path}")
    return {"static_path": str(folder)}
