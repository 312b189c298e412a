"""The prompt (prefix) cache: mlx-lm's LRUPromptCache with llama.cpp's reuse rule on top.

LRUPromptCache already finds the longest cached prefix (exact, shorter or longer entries, trimming
a longer one). llama.cpp always re-evaluates at least one prompt token (spec §5.9), so an exact
hit is trimmed by one token here; that also keeps ``BatchGenerator.insert`` fed with a non-empty
prompt.
"""

from __future__ import annotations

from typing import Any

from mlx_lm.models.cache import LRUPromptCache, can_trim_prompt_cache, trim_prompt_cache

_MODEL_KEY = "model"


class PrefixCache:
    def __init__(self, max_entries: int):
        self._lru = LRUPromptCache(max_size=max(1, max_entries))

    def __len__(self) -> int:
        return len(self._lru)

    def lookup(self, tokens: list[int]) -> tuple[list[Any] | None, int]:
        """Return (cache, n_reused): a KV cache holding ``tokens[:n_reused]``, n_reused < len."""
        if len(tokens) < 2:
            return None, 0
        cache, rest = self._lru.fetch_nearest_cache(_MODEL_KEY, tokens)
        if cache is None:
            return None, 0
        n_reused = len(tokens) - len(rest)
        if n_reused >= len(tokens):
            if not can_trim_prompt_cache(cache):
                return None, 0
            trim_prompt_cache(cache, n_reused - (len(tokens) - 1))
            n_reused = len(tokens) - 1
        if n_reused <= 0:
            return None, 0
        return cache, n_reused

    def longest(self, tokens: list[int]) -> tuple[list[Any] | None, int]:
        """A copy of the cache holding the longest cached prefix of ``tokens``, untrimmed."""
        if not tokens:
            return None, 0
        cache, rest = self._lru.fetch_nearest_cache(_MODEL_KEY, list(tokens))
        return (cache, len(tokens) - len(rest)) if cache is not None else (None, 0)

    def discard(self, tokens: list[int]) -> bool:
        """Drop the entry stored under exactly ``tokens``; True if there was one."""
        key = list(tokens)
        if self._lru._trie.search(_MODEL_KEY, key).exact is None:
            return False
        entry = self._lru._trie.pop(_MODEL_KEY, key)
        self._lru._n_bytes -= entry.nbytes
        self._lru._n_bytes_by_type[entry.cache_type] -= entry.nbytes
        self._lru._lru.remove(_MODEL_KEY, key)
        return True

    def store(self, tokens: list[int], cache: list[Any]) -> None:
        if tokens:
            self._lru.insert_cache(_MODEL_KEY, list(tokens), cache)

    def clear(self) -> None:
        self._lru.trim_to(n_sequences=0)
