"""llama-server's ``--models-dir DIR``: every model under DIR, one ``models`` entry each.

The models are found and named as the reference's ``load_from_models_dir`` (common/preset.cpp)
does: a ``.gguf`` file directly in DIR is a model named after the file less ``.gguf``; a folder
is a model named after the folder when it holds a ``.gguf`` file (the first shard
``-00001-of-`` of a split one), and here also when it is an mlx-lm folder (a ``config.json``).
Projector (``mmproj``) and draft files are companions, never models. Each model gets its own
replica deployment (as a config's ``models`` list), started without its model: the router loads
it on demand (deployments/serve/model_router.py).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import Any

from deployments.api.config import GraphArgs, replica_ongoing_limit
from deployments.api.deployment_names import replica_deployment
from deployments.cli.refused import Refused


def _sleep_seconds(seconds: int) -> str | None:
    return None if seconds == -1 or seconds > 0 else "invalid value: cannot be 0 or less than -1"


def _models_max(count: int) -> str | None:
    return None if count >= 0 else "invalid value"


def options(option: type) -> tuple:
    """llama-server's router options, as ``option`` (the command's Option class) describes them."""
    return (
        option(("--models-dir",), "models_dir", "LLAMA_ARG_MODELS_DIR",
               help="router mode: every model under this folder instead of -m (its .gguf files "
                    "and model folders, each named after its file or folder), loaded on demand"),
        option(("--models-max",), "models_max", "LLAMA_ARG_MODELS_MAX", int,
               "router mode: models loaded at once, the least recently used idle one unloaded "
               "past it (default 4; 0: no limit)", check=_models_max),
        option(("--models-autoload",), "models_autoload", "LLAMA_ARG_MODELS_AUTOLOAD", None,
               "router mode: a request loads the model it names (default; per request: "
               "?autoload=)", negative=("--no-models-autoload",)),
        option(("--sleep-idle-seconds",), "sleep_idle_seconds", None, int,
               "unload the model after this many seconds without a request, load it again on "
               "the next (default -1: never)", check=_sleep_seconds),
    )


def router_fields(ns: argparse.Namespace) -> dict[str, Any]:
    """--models-max, --models-autoload and --sleep-idle-seconds where given."""
    names = ("models_max", "models_autoload", "sleep_idle_seconds")
    return {name: getattr(ns, name) for name in names if getattr(ns, name, None) is not None}


DRAFT_PREFIXES = ("mtp-", "dspark-", "dflash-")  # the reference's draft_prefixes


def _companion(name: str) -> bool:
    """A projector or draft file the reference pairs with a model, never loads as one."""
    return "mmproj" in name or name.startswith(DRAFT_PREFIXES)


def _folder_model(folder: Path) -> Path | None:
    """The file or folder to load for one subfolder of the models folder, if it is a model."""
    ggufs = sorted(f for f in folder.iterdir() if f.name.endswith(".gguf") and f.is_file()
                   and not _companion(f.name))
    first_shards = [f for f in ggufs if "-00001-of-" in f.name]
    if first_shards:
        return first_shards[0]
    if ggufs:
        return ggufs[-1]  # the reference keeps the last one it lists
    return folder if (folder / "config.json").is_file() else None


def find_models(models_dir: str) -> list[tuple[str, Path]]:
    """(name, path) of every model under ``models_dir``, sorted by name."""
    root = Path(models_dir)
    if not root.is_dir():
        raise Refused(f"error: '{models_dir}' does not exist or is not a directory")
    found: list[tuple[str, Path]] = []
    for entry in sorted(root.iterdir()):
        if entry.is_dir():
            path = _folder_model(entry)
            if path is not None:
                found.append((entry.name, path))
        elif entry.name.endswith(".gguf") and not _companion(entry.name):
            found.append((entry.name.replace(".gguf", ""), entry))
    return sorted(found)


def models_fields(ns: argparse.Namespace, parallel: int,
                  context: Callable[[str], int]) -> dict[str, Any]:
    """The graph's ``model`` and ``models`` for --models-dir (none without it): each model's
    n_ctx is -c (else its training context, ``context``) split across ``parallel`` slots."""
    if not ns.models_dir:
        return {}
    if ns.model or ns.hf_repo or ns.model_url:
        raise Refused("--models-dir serves every model of its folder: give it without -m, "
                      "-hf or -mu")
    found = find_models(ns.models_dir)
    if not found:
        raise Refused(f"--models-dir {ns.models_dir}: no model found (.gguf files, or "
                      "folders holding one or an mlx-lm model)")
    entries = []
    for name, path in found:
        entry: dict[str, Any] = {"model": str(path.absolute()), "alias": name}
        total = ns.ctx_size or context(str(path.absolute()))
        if total and parallel >= 1:
            entry["n_ctx"] = max(8, total // parallel)
        entries.append(entry)
    return {"model": entries[0]["model"], "models": entries, "models_dir": ns.models_dir}


def model_deployments(graph: GraphArgs) -> list[dict]:
    """Each model's shaper and replica deployment options (named per model when the
    application has several: --models-dir)."""
    models = graph.model_configs()
    out = []
    for model in models:
        suffix = replica_deployment(model.model_name, len(models) > 1).removeprefix(
            "ModelReplica")
        out += [{"name": "ResponseShaper" + suffix, "ray_actor_options": {"num_cpus": 0.1}},
                {"name": "ModelReplica" + suffix,
                 "max_ongoing_requests": replica_ongoing_limit(model),
                 "ray_actor_options": {"num_cpus": 0.5}}]
    return out
