"""llama-server's ``-ctk/--cache-type-k`` and ``-ctv/--cache-type-v``: the KV cache's type; and
``-cram/--cache-ram``: the prefix cache's budget in MiB of KV arrays (engine/prefix_cache.py);
and mlxray's own ``--cache-disk DIR`` and ``--cache-disk-mib N``: its disk tier
(engine/disk_cache.py).

``q8_0`` and ``q4_0`` hold the cache quantized, 8 or 4 bits per value in groups of 32, batched
(engine/kv_quant.py); ``f32``, ``f16`` and ``bf16`` are the unquantized cache, which MLX keeps in
the model's own dtype. MLX quantizes keys and values alike, so both flags must name one type.
"""

from __future__ import annotations

import argparse
from typing import Any

from engine.types import CACHE_TYPES

DEFAULT = "f16"  # llama-server's default of both


def _cache_type(value: str) -> str | None:
    if value in CACHE_TYPES:
        return None
    return f"Unsupported cache type: {value} (mlxray takes {', '.join(CACHE_TYPES)})"


def kv_options(option: type) -> tuple:
    o = option
    help_text = ("KV cache type: q8_0 or q4_0 quantize it (MLX's affine quantization, groups of "
                 "32); f16, f32, bf16: unquantized, in the model's dtype; -ctk and -ctv must be "
                 "equal")
    return (
        o(("-ctk", "--cache-type-k"), "cache_type_k", "LLAMA_ARG_CACHE_TYPE_K", str,
          help_text, check=_cache_type),
        o(("-ctv", "--cache-type-v"), "cache_type_v", "LLAMA_ARG_CACHE_TYPE_V", str,
          help_text, check=_cache_type),
        o(("-cram", "--cache-ram"), "cache_ram", "LLAMA_ARG_CACHE_RAM", int,
          "the prefix cache's KV arrays, in MiB (default: 8192, -1 - no limit, 0 - disable); "
          "least recently used entries are evicted past it"),
    )


def add_arguments(p: argparse.ArgumentParser) -> None:
    """mlxray's own options (no llama-server counterpart)."""
    p.add_argument("--cache-disk", metavar="DIR", default=None,
                   help="keep the prompt cache's entries leaving RAM (and long prompts' as soon "
                        "as they are made) in this folder, for a restarted server and the "
                        "node's other replicas")
    p.add_argument("--cache-disk-mib", metavar="N", type=int, default=None,
                   help="the --cache-disk folder's bound in MiB (default: 16384, -1 - no "
                        "limit); least recently used files are removed past it")


def kv_fields(ns: argparse.Namespace) -> dict[str, Any]:
    """GraphArgs' ``kv_cache_type``, when either flag names one other than the default, and
    ``cache_ram_mib`` when -cram is given (any negative is llama-server's no limit)."""
    k, v = ns.cache_type_k or DEFAULT, ns.cache_type_v or DEFAULT
    if k != v:
        raise ValueError(f"-ctk {k} and -ctv {v}: the key and value cache types must be equal "
                         f"(MLX quantizes keys and values alike); give both -ctk {k} -ctv {k}")
    fields: dict[str, Any] = {} if k == DEFAULT else {"kv_cache_type": k}
    if ns.cache_ram is not None:
        fields["cache_ram_mib"] = max(-1, ns.cache_ram)
    if ns.cache_disk is not None:
        fields["cache_disk"] = ns.cache_disk
    if ns.cache_disk_mib is not None:
        fields["cache_disk_mib"] = max(-1, ns.cache_disk_mib)
    return fields
