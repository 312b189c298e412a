"""llama-server's ``--spec-type``, the ngram-simple sizes ``--spec-ngram-simple-size-n`` and
``--spec-ngram-simple-size-m``, and the draft model ``-md`` with ``--spec-draft-n-max``,
``--spec-draft-n-min`` and ``--spec-draft-p-min``: speculative decoding (engine/speculative.py,
engine/draft_model.py). Of the reference's kinds, ``none``, ``ngram-simple`` and
``draft-simple`` are taken; the others are refused, naming them (mlxray has no EAGLE3, MTP,
DFlash or DSpark heads, nor the n-gram map, mod and cache kinds)."""

from __future__ import annotations

import argparse
from typing import Any

KINDS = ("none", "ngram-simple", "draft-simple")
REFERENCE_KINDS = ("none", "draft-simple", "draft-eagle3", "draft-mtp", "draft-dflash",
                   "draft-dspark", "ngram-simple", "ngram-map-k", "ngram-map-k4v", "ngram-mod",
                   "ngram-cache")


def _spec_type(value: str) -> str | None:
    names = [name.strip() for name in value.split(",")]
    unknown = [name for name in names if name not in REFERENCE_KINDS]
    if unknown:
        return f"unknown speculative type: {unknown[0]}"
    untaken = [name for name in names if name not in KINDS]
    if untaken:
        return (f"--spec-type {untaken[0]}: mlxray's speculative decoding takes "
                f"{', '.join(KINDS)}")
    return None


def _size(value: int) -> str | None:
    return None if 1 <= value <= 1024 else "ngram size must be between 1 and 1024 inclusive"


def _n_max(value: int) -> str | None:
    return None if value >= 0 else "invalid value"


def options(option: type) -> tuple:
    o = option
    return (
        o(("--spec-type",), "spec_type", "LLAMA_ARG_SPEC_TYPE", str,
          "speculative decoding: none, ngram-simple (drafts from the sequence's own context) "
          "or draft-simple (drafts from -md's model; the default when -md is given without "
          "this flag); default: none", check=_spec_type),
        o(("-md", "--model-draft"), "model_draft", "LLAMA_ARG_MODEL_DRAFT", str,
          "draft model for speculative decoding (a folder or GGUF file with the model's "
          "vocabulary; default: unused)"),
        o(("--spec-draft-n-max",), "spec_draft_n_max", "LLAMA_ARG_SPEC_DRAFT_N_MAX", int,
          "number of tokens to draft for speculative decoding (default: 3)", check=_n_max),
        o(("--spec-draft-n-min",), "spec_draft_n_min", "LLAMA_ARG_SPEC_DRAFT_N_MIN", int,
          "minimum number of draft tokens to use for speculative decoding (default: 0)"),
        o(("--spec-draft-p-min", "--draft-p-min"), "spec_draft_p_min",
          "LLAMA_ARG_SPEC_DRAFT_P_MIN", float,
          "minimum speculative decoding probability (greedy) (default: 0.00)"),
        o(("--spec-ngram-simple-size-n",), "spec_ngram_simple_size_n", None, int,
          "ngram size N for ngram-simple speculative decoding, length of lookup n-gram "
          "(default: 12)", check=_size),
        o(("--spec-ngram-simple-size-m",), "spec_ngram_simple_size_m", None, int,
          "ngram size M for ngram-simple speculative decoding, length of draft m-gram "
          "(default: 48)", check=_size),
    )


def add_arguments(p: argparse.ArgumentParser) -> None:
    """mlxray's own option (no llama-server counterpart)."""
    p.add_argument("--no-spec-pace", dest="spec_pace", action="store_false", default=None,
                   help="speculate at every step that can, as llama-server does, rather than "
                        "only while speculation is measured faster than plain decoding")


def spec_fields(ns: argparse.Namespace) -> dict[str, Any]:
    """GraphArgs' speculative settings given on the command line (the last kind named wins;
    ``-md`` alone drafts with its model)."""
    fields: dict[str, Any] = {}
    if ns.spec_type is not None:
        fields["spec_type"] = [n.strip() for n in ns.spec_type.split(",")][-1]
    elif ns.model_draft is not None:
        fields["spec_type"] = "draft-simple"
    for name in ("model_draft", "spec_draft_n_max", "spec_draft_n_min", "spec_draft_p_min",
                 "spec_pace"):
        if getattr(ns, name) is not None:
            fields[name] = getattr(ns, name)
    if ns.spec_ngram_simple_size_n is not None:
        fields["spec_ngram_size_n"] = ns.spec_ngram_simple_size_n
    if ns.spec_ngram_simple_size_m is not None:
        fields["spec_ngram_size_m"] = ns.spec_ngram_simple_size_m
    return fields
