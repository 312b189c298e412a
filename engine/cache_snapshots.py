"""Prompt snapshots for caches that cannot be trimmed back.

A KV cache holding a prompt and its answer is trimmed back to any shorter prefix when a later
prompt shares it. Some caches cannot be: a sliding window (RotatingKVCache) once it has filled
has dropped the tokens a shorter prefix needs, and a state-space layer (ArraysCache: Mamba, the
linear layers of Qwen3-Next) holds one state for the whole sequence. For those models the engine
keeps snapshots inside the prompt, as llama.cpp keeps context checkpoints for SWA and recurrent
models: the prompt is fed to ``BatchGenerator`` in segments cut at the snapshot points, and at
each cut the sequence's cache is copied into the prefix cache under the tokens read so far.

The points, for a prompt of n tokens:
- n - 1: llama.cpp re-evaluates at least one prompt token, so a repeated prompt (retry,
  regenerate) needs the cache of its first n - 1 tokens, and so does a prompt that extends it;
  n_cmpl children start from the same copy;
- the branch point: where the prompt leaves the longest prefix it shares with a cached entry that
  could not be reused (an edited message), so the next edit from the same place reuses it
  (from ``MIN_BRANCH`` tokens on).

A snapshot is an entry of the prefix cache like any other: it counts against ``cache_entries`` and
is evicted least recently used first. A model whose caches stay trimmable for the whole request
(plain KV caches; a window the request cannot fill) takes none.
"""

from __future__ import annotations

from typing import Any

from mlx_lm.models.cache import CacheList, RotatingKVCache, make_prompt_cache

from .prefix_cache import Hit

# a shorter shared prefix is cheaper to read again than the entry a snapshot of it would take
MIN_BRANCH = 16


def trimmable_at(layer: Any, n_tokens: int) -> bool:
    """Whether a layer's cache holding ``n_tokens`` tokens can still be trimmed back."""
    if isinstance(layer, RotatingKVCache):
        return n_tokens < layer.max_size
    if isinstance(layer, CacheList):
        return all(trimmable_at(c, n_tokens) for c in layer.caches)
    return layer.is_trimmable()


class Snapshots:
    """Where to snapshot a prompt, decided from the model's cache layout."""

    def __init__(self, model: Any):
        self._layers = make_prompt_cache(model)

    def needed(self, n_tokens: int) -> bool:
        """True if a cache of ``n_tokens`` tokens could not be trimmed back."""
        return not all(trimmable_at(layer, n_tokens) for layer in self._layers)

    def points(self, n_prompt: int, hit: Hit, n_predict: int, n_ctx: int) -> list[int]:
        """Prompt positions to snapshot at, ascending, for a prompt of ``n_prompt`` tokens that
        reuses ``hit`` and may grow by ``n_predict`` tokens (-1: to ``n_ctx``)."""
        n_max = n_ctx if n_predict < 0 else min(n_ctx, n_prompt + n_predict)
        if n_prompt < 2 or not self.needed(n_max):
            return []
        points = {n_prompt - 1}
        if hit.n_shared > hit.n_reused and hit.n_shared >= MIN_BRANCH:
            points.add(hit.n_shared)
        return sorted(p for p in points if hit.n_reused < p < n_prompt)


def segments(tokens: list[int], cuts: list[int]) -> list[list[int]]:
    """``tokens`` cut before each position in ``cuts`` (ascending, inside the list)."""
    bounds = [0, *(c for c in cuts if 0 < c < len(tokens)), len(tokens)]
    return [tokens[a:b] for a, b in zip(bounds, bounds[1:])]
