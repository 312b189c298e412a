"""The llama-server options mlxray refuses, each spelling and variable with the reason printed
with the refusal (docs/llama-server-compat.md classifies each)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


class Refused(Exception):
    """A command line mlxray will not run; ``main`` prints it and exits with status 2, as
    argparse does for its own usage errors."""


@dataclass(frozen=True)
class Unhonored:
    """A llama-server option mlxray refuses: every spelling of it, its environment variable and
    why, printed with the refusal (docs/llama-server-compat.md classifies each)."""

    flags: tuple[str, ...]
    env: str | None
    reason: str


TENSOR_SPLIT = ("the ranks of a sharded model get even parts (mlx-lm's split): --shards N sets how "
                "many, --shard-mode (or -sm layer|row) how")
MAIN_GPU = ("rank 0 of a sharded model runs in the model replica, on its device; Ray places the "
            "other ranks")
KV_SHIFT = ("reusing cached chunks after the common prefix needs their keys re-rotated to new "
            "positions (llama.cpp's K-shift), which mlx-lm's caches do not do yet (issue #36); "
            "the prefix cache reuses the longest common prefix")
YARN = ("MLX's YaRN RoPE (mlx-lm rope_utils) has no such factor: set rope_scaling's mscale in "
        "the model's config.json instead")
REFUSED: tuple[Unhonored, ...] = (
    Unhonored(("-kvu", "--kv-unified", "-no-kvu", "--no-kv-unified"), "LLAMA_ARG_KV_UNIFIED",
              "each slot owns its KV cache: there is no shared KV buffer"),
    Unhonored(("--cache-reuse",), "LLAMA_ARG_CACHE_REUSE", KV_SHIFT),
    Unhonored(("-mm", "--mmproj"), "LLAMA_ARG_MMPROJ", "mlxray serves text-only models"),
    Unhonored(("--rerank", "--reranking"), "LLAMA_ARG_RERANKING",
              "reranking is not supported by mlxray (it serves no reranking models)"),
    Unhonored(("--yarn-ext-factor",), "LLAMA_ARG_YARN_EXT_FACTOR", YARN),
    Unhonored(("--yarn-attn-factor",), "LLAMA_ARG_YARN_ATTN_FACTOR", YARN),
    Unhonored(("-ts", "--tensor-split"), "LLAMA_ARG_TENSOR_SPLIT", TENSOR_SPLIT),
    Unhonored(("-mg", "--main-gpu"), "LLAMA_ARG_MAIN_GPU", MAIN_GPU),
    Unhonored(("--numa",), "LLAMA_ARG_NUMA", "MLX places its memory itself"),
    Unhonored(("--slot-prompt-similarity", "-sps"), None,
              "every slot shares the prefix cache: a request reuses the longest cached prefix "
              "whatever slot it gets"),
)

REFUSED_BY_NAME = {name: u for u in REFUSED for name in (*u.flags, *([u.env] if u.env else []))}


def refused_flags(argv: Sequence[str]) -> list[str]:
    return [a.split("=", 1)[0] for a in argv if a.split("=", 1)[0] in REFUSED_BY_NAME]


def refused_env(environ: dict[str, str]) -> list[str]:
    return [u.env for u in REFUSED if u.env and u.env in environ]


def refusal(names: list[str]) -> str:
    """Every refused option given, named, each with the reason mlxray does not honor it."""
    lines = [f"mlxray does not honor these llama-server options: {', '.join(names)} "
             "(see docs/llama-server-compat.md)"]
    lines += [f"  {name}: {REFUSED_BY_NAME[name].reason}" for name in names]
    return "\n".join(lines)
