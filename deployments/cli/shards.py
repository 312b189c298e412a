"""Splitting one model over several ranks from the command line: ``--shards N`` and
``--shard-mode pipeline|tensor`` (mlxray's own), and llama-server's ``-sm/--split-mode``, whose
``layer`` is ``pipeline`` and ``row`` is ``tensor`` (``none``: one rank)."""

from __future__ import annotations

import argparse
from typing import Any

SPLIT_MODES = {"layer": "pipeline", "row": "tensor", "none": None}


def _split_mode(value: str) -> str | None:
    return None if value in SPLIT_MODES else "invalid value"


def options(option: type) -> tuple:
    """llama-server's -sm, as ``option`` (the command's Option class) describes it."""
    return (
        option(("-sm", "--split-mode"), "split_mode", "LLAMA_ARG_SPLIT_MODE", str,
               "llama-server's split mode: layer (= --shard-mode pipeline), row (= tensor), "
               "none (one rank)", check=_split_mode),
    )


def add_arguments(p: argparse.ArgumentParser) -> None:
    """mlxray's own options (no llama-server counterpart)."""
    p.add_argument("--shards", type=int, default=None,
                   help="ranks one model replica is split over (default 1); Ray places them, "
                        "MLX's ring backend joins them")
    p.add_argument("--shard-mode", choices=("pipeline", "tensor"), default=None,
                   help="how a sharded model is split: pipeline (whole layers per rank, the "
                        "default) or tensor (every layer's heads)")


def shard_fields(ns: Any) -> dict[str, Any]:
    """GraphArgs' shards and shard_mode; ``--shard-mode`` wins over ``-sm``."""
    fields: dict[str, Any] = {}
    if ns.shards is not None:
        fields["shards"] = ns.shards
    mode = ns.shard_mode or SPLIT_MODES.get(ns.split_mode or "")
    if mode is not None:
        fields["shard_mode"] = mode
    if ns.split_mode == "none" and (ns.shards or 1) > 1:
        raise ValueError(f"-sm none keeps the model whole: it cannot go with --shards {ns.shards}")
    return fields
