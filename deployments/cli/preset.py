"""llama-server's ``--models-preset FILE``: an INI file of per-model settings for router mode.

Read as the reference reads it (common/preset.cpp ``load_from_ini``): ``[NAME]`` sections of
``key = value`` lines, ``;`` and ``#`` comments; a key is one of the command's flags without its
dashes (long or short: ``ctx-size``, ``c``) or its ``LLAMA_ARG_*`` variable; a switch takes
on/enabled/true/1 or off/disabled/false/0 (its ``no-`` spelling the other way round); ``[*]``
holds settings every model gets; ``version`` is skipped. A section named after a ``--models-dir``
model sets that model's options; any other is a model of its own, which names its file
(``model = PATH`` or ``hf-repo``). Precedence: the command line, then the model's section, then
``[*]``. Keys only a preset has: ``load-on-startup`` and ``stop-timeout``.
"""

from __future__ import annotations

import argparse
import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from deployments.cli.refused import REFUSED, Refused

log = logging.getLogger("mlxray")

DEFAULT_SECTION = "default"  # keys before any section header (COMMON_PRESET_DEFAULT_NAME)
GLOBAL_SECTION = "*"
PRESET_ONLY = {"load-on-startup": "LLAMA_ARG_PRESET_LOAD_ON_STARTUP",
               "stop-timeout": "LLAMA_ARG_PRESET_STOP_TIMEOUT"}
DEFAULT_STOP_TIMEOUT = 10  # the reference's DEFAULT_STOP_TIMEOUT, seconds
# set by the router for every model, dropped from a preset as the reference drops them
# (server-models.cpp unset_reserved_args, and update_args' host, port and alias)
ROUTER_DESTS = {"host", "port", "api_key", "api_key_file", "models_dir", "models_max",
                "models_preset", "models_autoload", "dump_config", "serve_proxy"}
TRUTHY = ("on", "enabled", "true", "1")
FALSEY = ("off", "disabled", "false", "0")

_HEADER = re.compile(r"^[ \t]*\[[ \t]*([^\]]+?)[ \t]*\][ \t]*(?:[;#].*)?$")
_KEY_VALUE = re.compile(r"^[ \t]*([A-Za-z_][A-Za-z0-9_.-]*)[ \t]*=[ \t]*(.*?)[ \t]*(?:[;#].*)?$")
_BLANK_OR_COMMENT = re.compile(r"^[ \t]*(?:[;#].*)?$")
_TAG = re.compile(r"[-.]([A-Z0-9_]+)$", re.IGNORECASE)


@dataclass
class Preset:
    """One section: the command-line arguments it stands for, and its preset-only keys."""

    name: str
    args: list[str] = field(default_factory=list)
    load_on_startup: bool | None = None
    stop_timeout: int | None = None
    sets_model: bool = False  # names its model file (model, hf-repo or model-url)
    aliases: list[str] = field(default_factory=list)  # its other names (alias = a, b)


def read_ini(path: str) -> dict[str, dict[str, str]]:
    """Each section's keys and values, in order; a repeated section starts over, as the
    reference's parser does, and a later key wins."""
    file = Path(path)
    if not file.exists():
        raise Refused(f"preset file does not exist: {path}")
    try:
        text = file.read_text()
    except (OSError, UnicodeDecodeError):
        raise Refused(f"failed to open server preset file: {path}") from None
    sections: dict[str, dict[str, str]] = {}
    current = DEFAULT_SECTION
    for line in re.split(r"\r\n|\n|\r", text):
        if header := _HEADER.match(line):
            current = header.group(1)
            sections[current] = {}
        elif pair := _KEY_VALUE.match(line):
            sections.setdefault(current, {})[pair.group(1)] = pair.group(2)
        elif not _BLANK_OR_COMMENT.match(line):
            raise Refused(f"failed to parse server config file: {path}")
    return sections


def canonical_name(name: str) -> str:
    """``repo:tag`` with its tag upper-cased as the reference writes it (``:q4_k_m`` →
    ``:Q4_K_M``, ``:model.q8_0`` → ``:Q8_0``)."""
    if name in (GLOBAL_SECTION, DEFAULT_SECTION) or ":" not in name:
        return name
    head, tag = name.rsplit(":", 1)
    match = _TAG.search(tag)
    return f"{head}:{(match.group(1) if match else tag).upper()}"


@dataclass(frozen=True)
class Spelling:
    """What a preset key stands for on the command line."""

    flag: str  # the spelling written into the arguments
    dest: str
    switch: bool  # takes no value
    other: str | None = None  # a switch's spelling the other way round


def spellings(parser: argparse.ArgumentParser, env_flags: Mapping[str, str]) -> dict[str, Spelling]:
    """Every key a preset may use: each flag of ``parser`` without its dashes, each variable of
    ``env_flags`` (variable → flag), and the refused options' spellings (the command then refuses
    them, saying why)."""
    by_flag: dict[str, Spelling] = {}
    for action in parser._actions:  # argparse keeps no public list of its options
        switch = action.nargs == 0
        for flag in action.option_strings:
            other = _opposite(parser, action) if switch else None
            by_flag[flag] = Spelling(flag, action.dest, switch, other)
    keys = {flag.lstrip("-"): s for flag, s in by_flag.items() if flag not in ("-h", "--help")}
    keys.update({env: by_flag[flag] for env, flag in env_flags.items() if flag in by_flag})
    for refused in REFUSED:
        for name in (*refused.flags, *([refused.env] if refused.env else [])):
            keys.setdefault(name.lstrip("-"), Spelling(refused.flags[-1], "refused", False))
    return keys


def _opposite(parser: argparse.ArgumentParser, action: argparse.Action) -> str | None:
    """The last spelling of the switch that sets ``action``'s destination the other way."""
    for other in parser._actions:
        if other.dest == action.dest and other is not action and other.nargs == 0:
            return other.option_strings[-1]
    return None


def _switch_args(spelling: Spelling, key: str, value: str, section: str) -> list[str]:
    lowered = value.strip().lower()
    if lowered not in TRUTHY + FALSEY:
        raise Refused(f"preset '{section}': {key} = {value!r}: invalid boolean value")
    if lowered in TRUTHY:
        return [spelling.flag]
    return [spelling.other] if spelling.other else []  # the reference skips it too


def _preset_only(preset: Preset, key: str, value: str) -> None:
    if key == "load-on-startup":
        if value.strip().lower() not in TRUTHY + FALSEY:
            raise Refused(f"preset '{preset.name}': load-on-startup = {value!r}: invalid "
                          "boolean value")
        preset.load_on_startup = value.strip().lower() in TRUTHY
        return
    try:
        preset.stop_timeout = int(value)
    except ValueError:  # the reference warns and keeps its default
        log.warning("invalid stop-timeout value '%s' for model '%s', using default %d seconds",
                    value, preset.name, DEFAULT_STOP_TIMEOUT)
        preset.stop_timeout = DEFAULT_STOP_TIMEOUT
    log.warning("preset '%s': stop-timeout accepted: it bounds how long llama-server waits for a "
                "model's process to stop; mlxray unloads a model inside its replica once the "
                "requests it is answering have ended, with no process to stop", preset.name)


def section_preset(name: str, keys: Mapping[str, str], known: Mapping[str, Spelling]) -> Preset:
    """One section as command-line arguments, in the order its keys are written."""
    preset = Preset(name)
    for key, value in keys.items():
        if key == "version":  # reserved by the reference
            continue
        only = key if key in PRESET_ONLY else next(
            (k for k, env in PRESET_ONLY.items() if env == key), None)
        if only is not None:
            _preset_only(preset, only, value)
            continue
        spelling = known.get(key)
        if spelling is None:
            raise Refused(f"option '{key}' not recognized in preset '{name}'")
        if spelling.dest in ROUTER_DESTS:
            log.warning("preset '%s': %s is set by the router, ignored", name, key)
            continue
        if spelling.dest == "alias":  # the model's other names; its own is the section's
            preset.aliases = [a.strip() for a in value.split(",") if a.strip()]
            continue
        preset.sets_model |= spelling.dest in ("model", "hf_repo", "model_url")
        preset.args += (_switch_args(spelling, key, value, name) if spelling.switch
                        else [spelling.flag, value])
    return preset


def load(path: str, known: Mapping[str, Spelling]) -> tuple[Preset, dict[str, Preset]]:
    """The ``[*]`` section (empty without one) and every model section, by name."""
    shared = Preset(GLOBAL_SECTION)
    models: dict[str, Preset] = {}
    for raw_name, keys in read_ini(path).items():
        name = canonical_name(raw_name)
        preset = section_preset(name, keys, known)
        if name == DEFAULT_SECTION and not preset.args and preset.load_on_startup is None \
                and preset.stop_timeout is None:
            continue
        if name == GLOBAL_SECTION:
            shared = preset
        else:
            models[name] = preset
    return shared, models
