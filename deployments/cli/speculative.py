"""llama-server's ``--spec-type`` and the ngram-simple sizes ``--spec-ngram-simple-size-n`` and
``--spec-ngram-simple-size-m``: n-gram speculative decoding (engine/speculative.py). Of the
reference's kinds, ``none`` and ``ngram-simple`` are taken; the others are refused, naming
them (mlxray has no draft model, nor the n-gram map, mod and cache kinds)."""

from __future__ import annotations

import argparse
from typing import Any

KINDS = ("none", "ngram-simple")
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


def options(option: type) -> tuple:
    o = option
    return (
        o(("--spec-type",), "spec_type", "LLAMA_ARG_SPEC_TYPE", str,
          "speculative decoding: none or ngram-simple (drafts from the sequence's own context, "
          "for greedy sequences; default: none)", check=_spec_type),
        o(("--spec-ngram-simple-size-n",), "spec_ngram_simple_size_n", None, int,
          "ngram size N for ngram-simple speculative decoding, length of lookup n-gram "
          "(default: 12)", check=_size),
        o(("--spec-ngram-simple-size-m",), "spec_ngram_simple_size_m", None, int,
          "ngram size M for ngram-simple speculative decoding, length of draft m-gram "
          "(default: 48)", check=_size),
    )


def spec_fields(ns: argparse.Namespace) -> dict[str, Any]:
    """GraphArgs' speculative settings given on the command line (the last kind named wins)."""
    fields: dict[str, Any] = {}
    if ns.spec_type is not None:
        fields["spec_type"] = [n.strip() for n in ns.spec_type.split(",")][-1]
    if ns.spec_ngram_simple_size_n is not None:
        fields["spec_ngram_size_n"] = ns.spec_ngram_simple_size_n
    if ns.spec_ngram_simple_size_m is not None:
        fields["spec_ngram_size_m"] = ns.spec_ngram_simple_size_m
    return fields
