"""llama-server's sampling options (``--top-k``, ``--top-p``, ``--dry-*``, ``--samplers``, ...):
server-wide defaults of a request's sampling fields, as the reference's ``params_base.sampling``.

Each lands in GraphArgs ``sampling`` under the request field it defaults (``--typical`` is
``typical_p``, ``--mirostat-lr`` is ``mirostat_eta``); the ingress reads that one object through
the request's own parser (deployments/serve/endpoint.py ``server_defaults``), so a default and the
same
value sent in a request are the same number, and a request's own field overrides it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

# option dest -> the request field it is the default of
FIELDS = {
    "top_k": "top_k", "top_p": "top_p", "min_p": "min_p", "top_n_sigma": "top_n_sigma",
    "xtc_probability": "xtc_probability", "xtc_threshold": "xtc_threshold",
    "typical": "typical_p", "repeat_last_n": "repeat_last_n",
    "repeat_penalty": "repeat_penalty", "presence_penalty": "presence_penalty",
    "frequency_penalty": "frequency_penalty", "dry_multiplier": "dry_multiplier",
    "dry_base": "dry_base", "dry_allowed_length": "dry_allowed_length",
    "dry_penalty_last_n": "dry_penalty_last_n", "dry_sequence_breaker": "dry_sequence_breakers",
    "dynatemp_range": "dynatemp_range", "dynatemp_exp": "dynatemp_exponent",
    "adaptive_target": "adaptive_target", "adaptive_decay": "adaptive_decay",
    "mirostat": "mirostat", "mirostat_lr": "mirostat_eta", "mirostat_ent": "mirostat_tau",
    "ignore_eos": "ignore_eos",
}
SAMPLER_FLAGS = ("--samplers", "--sampler-seq", "--sampling-seq")


def _not_negative(name: str) -> Any:
    def check(value: int) -> str | None:
        return f"error: invalid {name} = {value}" if value < 0 else None
    return check


def _repeat_penalty(value: float) -> str | None:
    ok = math.isfinite(value) and value > 0 and math.isfinite(1.0 / value)
    return None if ok else "error: repeat-penalty must be finite and greater than 0"


def _finite(name: str) -> Any:
    def check(value: float) -> str | None:
        return None if math.isfinite(value) else f"error: {name} must be finite"
    return check


def _breaker(value: str) -> list[str]:
    """One --dry-sequence-breaker: a list of one, so repeats extend it (action="extend")."""
    return [value]


def options(option: type) -> tuple:
    """The sampling options, as ``option`` (the command's Option class) describes them."""
    o = option
    return (
        o(("--top-k",), "top_k", "LLAMA_ARG_TOP_K", int, "default top_k (40; 0: off)"),
        o(("--top-p",), "top_p", None, float, "default top_p (0.95; 1.0: off)"),
        o(("--min-p",), "min_p", None, float, "default min_p (0.05; 0.0: off)"),
        o(("--top-nsigma", "--top-n-sigma"), "top_n_sigma", None, float,
          "default top_n_sigma (-1.0: off)"),
        o(("--xtc-probability",), "xtc_probability", None, float,
          "default xtc_probability (0.0: off)"),
        o(("--xtc-threshold",), "xtc_threshold", None, float, "default xtc_threshold (0.1)"),
        o(("--typical", "--typical-p"), "typical", None, float,
          "default typical_p (1.0: off)"),
        o(("--repeat-last-n",), "repeat_last_n", None, int,
          "default repeat_last_n (64; 0: off)", check=_not_negative("repeat-last-n")),
        o(("--repeat-penalty",), "repeat_penalty", None, float,
          "default repeat_penalty (1.0: off)", check=_repeat_penalty),
        o(("--presence-penalty",), "presence_penalty", None, float,
          "default presence_penalty (0.0: off)", check=_finite("presence-penalty")),
        o(("--frequency-penalty",), "frequency_penalty", None, float,
          "default frequency_penalty (0.0: off)", check=_finite("frequency-penalty")),
        o(("--dry-multiplier",), "dry_multiplier", None, float,
          "default dry_multiplier (0.0: off)"),
        o(("--dry-base",), "dry_base", None, float,
          "default dry_base (1.75; a value below 1 is ignored, as the reference)"),
        o(("--dry-allowed-length",), "dry_allowed_length", None, int,
          "default dry_allowed_length (2)"),
        o(("--dry-penalty-last-n",), "dry_penalty_last_n", None, int,
          "default dry_penalty_last_n (64; 0: off)", check=_not_negative("dry-penalty-last-n")),
        o(("--dry-sequence-breaker",), "dry_sequence_breaker", None, _breaker,
          "a default DRY sequence breaker (repeatable; the first clears the defaults "
          "'\\n', ':', '\"', '*'; none: no breakers)", repeat=True),
        o(("--dynatemp-range",), "dynatemp_range", None, float,
          "default dynatemp_range (0.0: off)"),
        o(("--dynatemp-exp",), "dynatemp_exp", None, float, "default dynatemp_exponent (1.0)"),
        o(("--adaptive-target",), "adaptive_target", None, float,
          "default adaptive_target (-1.0: off)"),
        o(("--adaptive-decay",), "adaptive_decay", None, float, "default adaptive_decay (0.9)"),
        o(("--mirostat",), "mirostat", None, int,
          "default mirostat (0: off, 1: Mirostat, 2: Mirostat 2.0)"),
        o(("--mirostat-lr",), "mirostat_lr", None, float, "default mirostat_eta (0.1)"),
        o(("--mirostat-ent",), "mirostat_ent", None, float, "default mirostat_tau (5.0)"),
        o(("--samplers",), "samplers", None, str,
          "default sampler chain, names separated by ';' (penalties;dry;top_n_sigma;top_k;"
          "typ_p;top_p;min_p;xtc;temperature)"),
        o(("--sampler-seq", "--sampling-seq"), "sampler_seq", None, str,
          "default sampler chain, one letter each (edskypmxt)"),
        o(("--ignore-eos",), "ignore_eos", None, None,
          "default ignore_eos: generate past the end-of-generation tokens"),
    )


def breakers(given: list[str]) -> list[str]:
    """--dry-sequence-breaker's values as the reference folds them: ``none`` clears the list."""
    out: list[str] = []
    for value in given:
        out = [] if value == "none" else [*out, value]
    return out


def samplers(ns: Any, argv: Sequence[str]) -> list[str] | str | None:
    """The sampler chain the last of --samplers / --sampler-seq gives: a list of names, or a
    string of letters (the request field's two forms)."""
    given = [a.split("=", 1)[0] for a in argv if a.split("=", 1)[0] in SAMPLER_FLAGS]
    if not given:
        return None
    if given[-1] == "--samplers":
        return [name for name in ns.samplers.split(";") if name]
    return ns.sampler_seq


def sampling_fields(ns: Any, argv: Sequence[str]) -> dict[str, Any]:
    """GraphArgs ``sampling``: each sampling option given, under its request field."""
    out: dict[str, Any] = {}
    for dest, field in FIELDS.items():
        value = getattr(ns, dest, None)
        if value is None:
            continue
        out[field] = breakers(value) if dest == "dry_sequence_breaker" else value
    if out.get("dry_base", 1.0) < 1.0:  # the reference keeps its default for a base below 1
        del out["dry_base"]
    chain = samplers(ns, argv)
    if chain is not None:
        out["samplers"] = chain
    return out
