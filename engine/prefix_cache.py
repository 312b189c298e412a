"""The prompt (prefix) cache: mlx-lm's LRUPromptCache with llama.cpp's reuse rule on top.

Entries are KV caches keyed by the tokens they hold, in one trie per key (the LoRA adapters and
scales they were computed under: a prompt never reuses another setting's prefix), evicted least
recently used first (a hit counts as a use). llama.cpp always re-evaluates at least one prompt
token (spec §5.9), so a prompt of n tokens reuses at most n - 1: the longest entry that is a
prefix of its first n - 1 tokens, or an entry sharing a longer prefix trimmed back to it where its
cache can be trimmed. Caches that cannot be trimmed (sliding windows once full, state-space
layers) are reused only from an entry that is an exact prefix: engine/cache_snapshots.py stores
such entries inside the prompt as it is read.

With a disk tier (engine/disk_cache.py), an entry leaving RAM (evicted, or past the whole byte
budget) and a long entry as soon as it is stored are handed to it, and a lookup that finds less
in RAM than the prompt could reuse asks it for the longest prefix on disk.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from mlx_lm.models.cache import LRUPromptCache, can_trim_prompt_cache, trim_prompt_cache

if TYPE_CHECKING:
    from .disk_cache import DiskCache

_MODEL_KEY = "model"  # entries without adapters; others go under engine/lora.py's adapter_key
_VALUE = "__value__"  # LRUPromptCache's trie: a node's entry, beside its children by token


@dataclass
class Hit:
    """What a prompt finds in the cache: a private copy of a cache holding ``n_reused`` prompt
    tokens (None and 0 on a miss), and ``n_shared``, the longest prefix (at most n - 1) the prompt
    shares with any cached entry, reusable or not."""

    cache: list[Any] | None = None
    n_reused: int = 0
    n_shared: int = 0
    n_disk: int = 0  # n_reused, when the cache was read from disk


class PrefixCache:
    """At most ``max_entries`` entries and ``max_bytes`` bytes of KV arrays (None: no byte limit;
    0: the cache keeps nothing, llama-server's ``--cache-ram 0``)."""

    def __init__(self, max_entries: int, max_bytes: int | None = None,
                 disk: DiskCache | None = None):
        self._max_bytes = max_bytes
        limit = {} if max_bytes is None else {"max_bytes": max_bytes}
        self._lru = LRUPromptCache(max_size=max(1, max_entries), **limit)
        self.disk = disk
        if disk is not None:
            self._lru._lru.pop = self._evicting(self._lru._lru.pop)

    def _evicting(self, pop: Callable[[], tuple]) -> Callable[[], tuple]:
        """LRUPromptCache's eviction order, handing each entry it evicts to the disk tier (it
        pops the order only to evict, and the entry is still in the trie then)."""

        def evict() -> tuple:
            key, tokens = pop()
            self.disk.put(tokens, self._entry(tokens, key).prompt_cache, key)
            return key, tokens

        return evict

    def __len__(self) -> int:
        return len(self._lru)

    @property
    def nbytes(self) -> int:
        return self._lru.nbytes

    def lookup(self, tokens: list[int], key: str = _MODEL_KEY) -> Hit:
        """The longest reusable prefix of ``tokens`` but its last token, from RAM, else from
        disk where it holds more."""
        hit = self._lookup(tokens, key)
        if self.disk is None or hit.n_reused >= len(tokens) - 1:
            return hit
        cache, n_disk, n_shared = self.disk.lookup(list(tokens[:-1]), key, hit.n_reused)
        if cache is None:
            return Hit(hit.cache, hit.n_reused, max(hit.n_shared, n_shared))
        return Hit(cache, n_disk, max(hit.n_shared, n_shared), n_disk)

    def _lookup(self, tokens: list[int], key: str) -> Hit:
        head = list(tokens[:-1])
        if not head:
            return Hit()
        node, n_shared, prefix = self._root(key), 0, None
        while node is not None and n_shared < len(head) and head[n_shared] in node:
            node = node[head[n_shared]]
            n_shared += 1
            if _VALUE in node:
                prefix = n_shared
        trimmable = _shortest_trimmable(node) if n_shared > (prefix or 0) else None
        if trimmable is not None:
            suffix, entry = trimmable
            cache = copy.deepcopy(entry.prompt_cache)
            trim_prompt_cache(cache, len(suffix))
            self._touch(head[:n_shared] + suffix, key)
            return Hit(cache, n_shared, n_shared)
        if prefix is None:
            return Hit(None, 0, n_shared)
        self._touch(head[:prefix], key)
        return Hit(copy.deepcopy(self._entry(head[:prefix], key).prompt_cache), prefix, n_shared)

    def longest(self, tokens: list[int],
                key: str = _MODEL_KEY) -> tuple[list[Any] | None, int]:
        """A copy of the cache holding the longest cached prefix of ``tokens``, untrimmed."""
        if not tokens:
            return None, 0
        cache, rest = self._lru.fetch_nearest_cache(key, list(tokens))
        return (cache, len(tokens) - len(rest)) if cache is not None else (None, 0)

    def discard(self, tokens: list[int], key: str = _MODEL_KEY) -> bool:
        """Drop the entry stored under exactly ``tokens``; True if there was one."""
        tokens = list(tokens)
        if self._lru._trie.search(key, tokens).exact is None:
            return False
        entry = self._lru._trie.pop(key, tokens)
        self._lru._n_bytes -= entry.nbytes
        self._lru._n_bytes_by_type[entry.cache_type] -= entry.nbytes
        self._lru._lru.remove(key, tokens)
        return True

    def discard_prefixes(self, tokens: list[int], key: str = _MODEL_KEY) -> int:
        """Drop every entry stored under a prefix of ``tokens`` (a slot's prompt snapshots and its
        last state); the longest one's length, 0 if none."""
        stored, node = [], self._root(key)
        for depth, token in enumerate(tokens, 1):
            node = node.get(token) if node is not None else None
            if node is None:
                break
            if _VALUE in node:
                stored.append(depth)
        for depth in stored:
            self.discard(tokens[:depth], key)
        if self.disk is not None:
            self.disk.discard_prefixes(list(tokens), key)
        return max(stored, default=0)

    def store(self, tokens: list[int], cache: list[Any], key: str = _MODEL_KEY) -> None:
        """Keep ``cache`` under ``tokens``, evicting the least recently used entries until the
        bounds hold; an entry larger than the whole byte budget is skipped, leaving the others
        (as llama-server's prompt cache does: with a disk tier, it goes there)."""
        if not tokens:
            return
        disk = self.disk
        if self._max_bytes is not None and sum(c.nbytes for c in cache) > self._max_bytes:
            if disk is not None:
                disk.put(list(tokens), cache, key)
            return
        if disk is not None and len(tokens) >= disk.eager_tokens:
            disk.put(list(tokens), cache, key)
        self._lru.insert_cache(key, list(tokens), cache)

    def clear(self) -> None:
        self._lru.trim_to(n_sequences=0)

    # ---- the trie of mlx-lm's LRUPromptCache ------------------------------------------------
    def _root(self, key: str) -> dict | None:
        return self._lru._trie._trie.get(key)

    def _entry(self, tokens: list[int], key: str) -> LRUPromptCache.CacheEntry:
        return self._lru._trie.get(key, tokens)

    def _touch(self, tokens: list[int], key: str) -> None:
        """A hit makes its entry the most recently used."""
        order = self._lru._lru
        order.remove(key, tokens)
        order.push(key, tokens)


def cache_bytes(cache_ram_mib: int) -> int | None:
    """llama-server's --cache-ram N in bytes: N MiB, None for no limit (N < 0), 0 for none."""
    return None if cache_ram_mib < 0 else cache_ram_mib * 1024 * 1024


def _shortest_trimmable(node: dict) -> tuple[list[int], Any] | None:
    """The shortest entry below ``node`` whose cache can be trimmed: (its tokens past the node,
    the entry). Paths are kept as linked (token, parent) pairs: no list copy per node."""
    best: tuple[int, tuple | None, Any] | None = None
    stack: list[tuple[dict, int, tuple | None]] = [(node, 0, None)]
    while stack:
        current, depth, path = stack.pop()
        if best is not None and depth >= best[0]:
            continue
        entry = current.get(_VALUE)
        if entry is not None and can_trim_prompt_cache(entry.prompt_cache):
            best = (depth, path, entry)
            continue
        stack.extend((child, depth + 1, (token, path)) for token, child in current.items()
                     if token != _VALUE)
    if best is None:
        return None
    suffix, path = [], best[1]
    while path is not None:
        token, path = path
        suffix.append(token)
    return suffix[::-1], best[2]
