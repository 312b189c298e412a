"""One row per numeric sampler setting, as llama.cpp carries a setting from its flag to the
sampler through one struct (common_params_sampling) and describes the request field once
(server-schema.cpp): the request field's name (also the attribute of engine/types.py's
SamplingParams and of the API's CompletionParams), its kind and limits in the request schema,
its default, llama-server's option flags, environment variable and help text, and its place in
``generation_settings``. Everything else is derived from the rows: the schema's fields
(deployments/api/schema.py), both dataclasses' attributes and defaults, the server-default keys
(deployments/api/defaults.py), the command's options (deployments/cli/sampling.py) and the
``generation_settings`` key order (deployments/api/shapes.py). Adding a sampler setting is a row.

Rows are in the request schema's order (the reference's). The list-valued and custom settings
(``dry_sequence_breakers``, ``samplers``, ``logit_bias``, ``seed``, ...) keep their own code.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, make_dataclass
from typing import Any

INT32_MAX = 2**31 - 1
FLT_MAX = 3.4028234663852886e38


@dataclass(frozen=True)
class SamplerField:
    name: str  # the request field; SamplingParams' and CompletionParams' attribute
    kind: str  # the schema's kind: int32 or float
    default: int | float  # the reference's default (a float is stored as float32 by the API)
    flags: tuple[str, ...] = ()  # llama-server's options ((): set by another option, or none)
    help: str = ""  # the option's help; {default} is the default
    env: str | None = None  # its LLAMA_ARG_* variable, where mlxray reads one
    dest: str = ""  # the option's argparse dest, when not the field's name
    soft: tuple[float, float] | None = None  # clamped into this range
    hard: tuple[float, float] | None = None  # refused outside it
    check: str = ""  # the option value the reference refuses: not_negative, positive, finite
    settings: int = 0  # its place in generation_settings (after seed; 0: the schema's order)

    @property
    def option_dest(self) -> str:
        return self.dest or self.name

    @property
    def option_help(self) -> str:
        return self.help.format(default=self.default)

    def option_check(self) -> Callable[[Any], str | None] | None:
        """llama-server's refusal of the option's value (its message), None for a value it takes."""
        flag = self.flags[0].lstrip("-") if self.flags else self.name
        if self.check == "not_negative":
            return lambda v: f"error: invalid {flag} = {v}" if v < 0 else None
        if self.check == "positive":
            return lambda v: None if math.isfinite(v) and v > 0 and math.isfinite(1.0 / v) else (
                f"error: {flag} must be finite and greater than 0")
        if self.check == "finite":
            return lambda v: None if math.isfinite(v) else f"error: {flag} must be finite"
        return None


S = SamplerField
SAMPLER_FIELDS: tuple[SamplerField, ...] = (
    S("top_k", "int32", 40, ("--top-k",), "default top_k ({default}; 0: off)", "LLAMA_ARG_TOP_K",
      soft=(0, INT32_MAX), settings=4),
    S("top_p", "float", 0.95, ("--top-p",), "default top_p ({default}; 1.0: off)",
      soft=(0.0, 1.0), settings=5),
    S("min_p", "float", 0.05, ("--min-p",), "default min_p ({default}; 0.0: off)",
      soft=(0.0, 1.0), settings=6),
    S("top_n_sigma", "float", -1.0, ("--top-nsigma", "--top-n-sigma"),
      "default top_n_sigma ({default}: off)", settings=7),
    S("xtc_probability", "float", 0.0, ("--xtc-probability",),
      "default xtc_probability ({default}: off)", soft=(0.0, 1.0), settings=8),
    S("xtc_threshold", "float", 0.1, ("--xtc-threshold",), "default xtc_threshold ({default})",
      soft=(0.0, 1.0), settings=9),
    S("typical_p", "float", 1.0, ("--typical", "--typical-p"),
      "default typical_p ({default}: off)", dest="typical", settings=10),
    # its option is the command's --temp (GraphArgs.temperature)
    S("temperature", "float", 0.8, soft=(0.0, math.inf), settings=1),
    S("dynatemp_range", "float", 0.0, ("--dynatemp-range",),
      "default dynatemp_range ({default}: off)", settings=2),
    S("dynatemp_exponent", "float", 1.0, ("--dynatemp-exp",),
      "default dynatemp_exponent ({default})", dest="dynatemp_exp", settings=3),
    S("repeat_last_n", "int32", 64, ("--repeat-last-n",),
      "default repeat_last_n ({default}; 0: off)", hard=(0, INT32_MAX), check="not_negative",
      settings=11),
    S("repeat_penalty", "float", 1.0, ("--repeat-penalty",),
      "default repeat_penalty ({default}: off)", check="positive", settings=12),
    S("frequency_penalty", "float", 0.0, ("--frequency-penalty",),
      "default frequency_penalty ({default}: off)", check="finite", settings=14),
    S("presence_penalty", "float", 0.0, ("--presence-penalty",),
      "default presence_penalty ({default}: off)", check="finite", settings=13),
    S("dry_multiplier", "float", 0.0, ("--dry-multiplier",),
      "default dry_multiplier ({default}: off)", settings=15),
    S("dry_base", "float", 1.75, ("--dry-base",),
      "default dry_base ({default}; a value below 1 is ignored, as the reference)", settings=16),
    S("dry_allowed_length", "int32", 2, ("--dry-allowed-length",),
      "default dry_allowed_length ({default})", hard=(0, INT32_MAX), settings=17),
    S("dry_penalty_last_n", "int32", 64, ("--dry-penalty-last-n",),
      "default dry_penalty_last_n ({default}; 0: off)", hard=(0, INT32_MAX),
      check="not_negative", settings=18),
    S("mirostat", "int32", 0, ("--mirostat",),
      "default mirostat ({default}: off, 1: Mirostat, 2: Mirostat 2.0)", soft=(0, 2),
      settings=20),
    S("mirostat_tau", "float", 5.0, ("--mirostat-ent",), "default mirostat_tau ({default})",
      dest="mirostat_ent", settings=21),
    S("mirostat_eta", "float", 0.1, ("--mirostat-lr",), "default mirostat_eta ({default})",
      dest="mirostat_lr", settings=22),
    S("adaptive_target", "float", -1.0, ("--adaptive-target",),
      "default adaptive_target ({default}: off)", soft=(-FLT_MAX, 1.0), settings=23),
    S("adaptive_decay", "float", 0.9, ("--adaptive-decay",), "default adaptive_decay ({default})",
      hard=(0.0, 0.99), settings=24),
)
del S

# generation_settings: dry_sequence_breakers sits between the rows placed before and after it
BREAKERS_SETTING = 19


def by_settings() -> tuple[list[SamplerField], list[SamplerField]]:
    """The rows in generation_settings' order: those before dry_sequence_breakers, and after."""
    rows = sorted(SAMPLER_FIELDS, key=lambda f: f.settings)
    return ([f for f in rows if f.settings < BREAKERS_SETTING],
            [f for f in rows if f.settings > BREAKERS_SETTING])


def sampler_dataclass(name: str, store: Callable[[SamplerField], Any] = lambda f: f.default,
                      slots: bool = True) -> type:
    """A dataclass of one attribute per row, default ``store(row)``: the base of SamplingParams
    (the defaults as written) and of CompletionParams (floats stored as float32)."""
    types = {"int32": int, "float": float}
    return make_dataclass(name, [(f.name, types[f.kind], field(default=store(f)))
                                 for f in SAMPLER_FIELDS], slots=slots)
