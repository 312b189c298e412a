"""llama-server's router options: ``--models-dir DIR`` (every model under DIR, found and named
by deployments/api/models_folder.py) and ``--models-preset FILE`` (deployments/cli/preset.py), one
``models`` entry each. Each model gets its own replica deployment (as a config's ``models``
list), started without its model: the router loads it on demand
(deployments/serve/model_router.py).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from deployments.api.config import GraphArgs, replica_ongoing_limit
from deployments.api.deployment_names import replica_deployment
from deployments.api.models_folder import find_models
from deployments.cli import preset
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
        option(("--models-preset",), "models_preset", "LLAMA_ARG_MODELS_PRESET",
               help="router mode: an INI file of models and their settings, one [section] "
                    "each (keys: the flags without dashes; [*]: every model's)"),
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


def routed(ns: argparse.Namespace) -> bool:
    return bool(ns.models_dir or ns.models_preset)


# the command's own router flags, left out of each model's arguments (flag: takes a value)
ROUTER_FLAGS = {"--models-dir": True, "--models-preset": True, "--models-max": True,
                "--models-autoload": False, "--no-models-autoload": False}


def without_router_flags(argv: list[str]) -> list[str]:
    """``argv`` less the router's flags and their values (``--flag value`` or ``--flag=v``)."""
    out: list[str] = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
        elif arg in ROUTER_FLAGS:
            skip = ROUTER_FLAGS[arg]
        elif arg.split("=", 1)[0] not in ROUTER_FLAGS:
            out.append(arg)
    return out


def models_fields(ns: argparse.Namespace, entry: Callable[[list[str]], dict[str, Any]],
                  keys: Callable[[], Mapping[str, preset.Spelling]]) -> dict[str, Any]:
    """The graph's ``model`` and ``models`` in router mode (none without it): every model of
    --models-dir and of --models-preset, by name. ``entry(head)`` is one model's ``models``
    entry, its arguments ``head`` (its file, then the preset's [*] and its own section)
    followed by the command line's; ``keys()`` the keys a preset may use (read with one)."""
    if not routed(ns):
        return {}
    if ns.model or ns.hf_repo or ns.model_url:
        raise Refused("--models-dir and --models-preset serve the models they name: give them "
                      "without -m, -hf or -mu")
    try:
        found = dict(find_models(ns.models_dir)) if ns.models_dir else {}
    except ValueError as exc:
        raise Refused(str(exc)) from None
    shared, sections = (preset.load(ns.models_preset, keys()) if ns.models_preset
                        else (preset.Preset(preset.GLOBAL_SECTION), {}))
    if shared.aliases:  # the reference refuses it too: every model would have that name
        raise Refused(f"preset '*': alias '{shared.aliases[0]}' would name every model")
    if not found and not sections:
        where = f"--models-dir {ns.models_dir}" if ns.models_dir else \
            f"--models-preset {ns.models_preset}"
        raise Refused(f"{where}: no model found (.gguf files, folders holding one or an mlx-lm "
                      "model, or preset sections)")
    entries = [_entry(name, found.get(name), shared, sections.get(name), entry)
               for name in sorted({*found, *sections})]
    at_start = [e["alias"] for e in entries if e.get("load_on_startup")]
    models_max = 4 if ns.models_max is None else ns.models_max
    if 0 < models_max < len(at_start):
        raise Refused(f"number of models to load on startup ({len(at_start)}) exceeds "
                      f"models_max ({models_max})")
    router = {"models_dir": ns.models_dir, "models_preset": ns.models_preset}
    return {"model": entries[0]["model"], "models": entries,
            **{k: v for k, v in router.items() if v}}


def _entry(name: str, path: Path | None, shared: preset.Preset, section: preset.Preset | None,
           entry: Callable[[list[str]], dict[str, Any]]) -> dict[str, Any]:
    """One model's entry: its folder's file under its section's settings and [*]'s."""
    if path is None and not (section and section.sets_model):
        raise Refused(f"preset '{name}' names no model file: give it model = PATH (or hf-repo)")
    head = (["-m", str(path.absolute())] if path else []) + shared.args
    head += section.args if section else []
    out = {**entry(head), "alias": name, "model_source": "preset" if section else "models_dir"}
    if path is not None and not (section and section.sets_model):
        out["model"] = str(path.absolute())  # as the folder lists it (-m resolves links)
    if section and section.aliases:
        out["aliases"] = list(section.aliases)
    starts = [p.load_on_startup for p in (section, shared) if p and p.load_on_startup is not None]
    if starts and starts[0]:
        out["load_on_startup"] = True
    return out


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
