"""The quantized KV cache (``-ctk/-ctv q8_0|q4_0``), batched.

mlx-lm keeps a quantized cache for one sequence (``QuantizedKVCache``) but not for a batch: its
server turns batching off with ``--kv-bits``. ``QuantizedBatchKVCache`` is mlx-lm's
``BatchKVCache`` (left-padded rows, a shared write index) whose keys and values are held as
``mx.quantize`` triples (packed uint32, scales, biases) along the head dimension, in groups of 32.
The models see ``bits`` on the cache and attend through mlx-lm's
``quantized_scaled_dot_product_attention``.

Each sequence's own cache (what the prefix cache stores, trims and copies, and what a batch is
merged from) is ``QuantizedSequenceCache``: mlx-lm's ``QuantizedKVCache`` that knows its size and
how to merge into the batched one.

llama.cpp's q8_0 / q4_0 are symmetric (one scale per 32 values); MLX's quantization is affine (a
scale and a bias per 32 values), so the bytes and the rounding differ; the bits per value are
alike.
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx
from mlx.utils import tree_map
from mlx_lm.models.cache import (
    KVCache,
    QuantizedKVCache,
    dynamic_roll,
    make_prompt_cache,
)

from .batching import OpenBatchKVCache
from .types import CACHE_TYPES, QUANTIZED_TYPES

GROUP_SIZE = 32  # llama.cpp's q8_0 / q4_0 block

Triple = tuple[mx.array, mx.array, mx.array]


def cache_bits(cache_type: str) -> int | None:
    """The bits of a llama.cpp cache type; None for the unquantized ones."""
    if cache_type not in CACHE_TYPES:
        raise ValueError(f"unsupported KV cache type {cache_type!r}: one of "
                         f"{', '.join(CACHE_TYPES)}")
    return QUANTIZED_TYPES.get(cache_type)


class QuantizedSequenceCache(QuantizedKVCache):
    """One sequence's quantized cache, mergeable into a ``QuantizedBatchKVCache``."""

    def __init__(self, bits: int, group_size: int = GROUP_SIZE):
        super().__init__(group_size=group_size, bits=bits)

    def size(self) -> int:
        return self.offset

    @classmethod
    def merge(cls, caches: list[QuantizedSequenceCache]) -> QuantizedBatchKVCache:
        return QuantizedBatchKVCache.merge(caches)

    @classmethod
    def of(cls, cache: Any, bits: int) -> QuantizedSequenceCache:
        """A layer of another kind (a restored slot file) as this engine's cache."""
        if isinstance(cache, QuantizedSequenceCache) and cache.bits == bits:
            return cache
        out = cls(bits)
        if isinstance(cache, QuantizedKVCache):
            if cache.keys is not None:
                keys, values = tree_map(lambda x: x[..., : cache.offset, :],
                                        (cache.keys, cache.values))
                keys = _requantize(keys, cache, bits)
                values = _requantize(values, cache, bits)
                out.keys, out.values, out.offset = keys, values, cache.offset
            return out
        if isinstance(cache, KVCache):
            if cache.keys is not None:
                out.keys = _quantize(cache.keys[..., : cache.offset, :], bits)
                out.values = _quantize(cache.values[..., : cache.offset, :], bits)
                out.offset = cache.offset
            return out
        raise TypeError(f"a {type(cache).__name__} cannot be held as a quantized KV cache")


class QuantizedBatchKVCache(OpenBatchKVCache):
    """mlx-lm's ``BatchKVCache`` with keys and values quantized (see the module's text)."""

    def __init__(self, left_padding: list[int], bits: int, group_size: int = GROUP_SIZE):
        super().__init__(left_padding)
        self.bits = bits
        self.group_size = group_size

    def update_and_fetch(self, keys: mx.array, values: mx.array) -> tuple[Triple, Triple]:
        prev, n_new = self.write_index, keys.shape[2]
        if self.keys is None or prev + n_new > self.keys[0].shape[2]:
            self._grow(keys, values, n_new)
        self.offset = self.offset + n_new
        self.write_index += n_new
        for held, new in ((self.keys, self._quantize(keys)),
                          (self.values, self._quantize(values))):
            for part, fresh in zip(held, new):
                part[..., prev: self.write_index, :] = fresh
        return self.keys_and_values()

    def _grow(self, keys: mx.array, values: mx.array, n_new: int) -> None:
        batch, heads = keys.shape[:2]
        n_steps = (self.step + n_new - 1) // self.step * self.step
        shape = (batch, heads, n_steps)

        def blank(dim: int, dtype: mx.Dtype) -> Triple:
            per_word = 32 // self.bits
            groups = dim // self.group_size
            return (mx.zeros((*shape, dim // per_word), mx.uint32),
                    mx.zeros((*shape, groups), dtype), mx.zeros((*shape, groups), dtype))

        new_k, new_v = blank(keys.shape[3], keys.dtype), blank(values.shape[3], values.dtype)
        if self.keys is None:
            self.keys, self.values = new_k, new_v
            return
        held = self.write_index
        self.keys, self.values = (
            tuple(mx.concatenate([old[..., :held, :], add], axis=2) for old, add in zip(o, n))
            for o, n in ((self.keys, new_k), (self.values, new_v)))

    def _quantize(self, x: mx.array) -> Triple:
        return tuple(mx.quantize(x, group_size=self.group_size, bits=self.bits))

    def keys_and_values(self) -> tuple[Triple, Triple]:
        idx = self.write_index
        return tuple(tuple(p[..., :idx, :] for p in t) for t in (self.keys, self.values))

    def finalize(self) -> None:
        if self.right_padding is not None:
            shift = self.right_padding[:, None]
            self.keys, self.values = tree_map(lambda x: dynamic_roll(x, shift, axis=2),
                                              (self.keys, self.values))
            self.offset = self.offset - self.right_padding
            self.left_padding += self.right_padding
            self.right_padding = None

    def filter(self, batch_indices: list[int]) -> None:
        if self.keys is not None:
            self.keys, self.values = tree_map(lambda x: x[batch_indices],
                                              (self.keys, self.values))
        self.offset = self.offset[batch_indices]
        self.left_padding = self.left_padding[batch_indices]
        min_left_pad = min(self.left_padding.tolist())
        if min_left_pad > 0:
            if self.keys is not None:
                self.keys, self.values = tree_map(lambda x: x[..., min_left_pad:, :],
                                                  (self.keys, self.values))
            self.write_index -= min_left_pad
            self.left_padding -= min_left_pad

    def extend(self, other: QuantizedBatchKVCache) -> None:
        if self.keys is None and other.keys is None:
            self.left_padding = mx.concatenate([self.left_padding, other.left_padding])
            self.offset = mx.concatenate([self.offset, other.offset])
            return
        max_idx = max(self.write_index, other.write_index)
        sizes = [c.keys[0].shape[2] for c in (self, other) if c.keys is not None]
        template = self if self.keys is not None else other
        max_size = max(sizes)

        def aligned(c: QuantizedBatchKVCache) -> tuple:
            if c.keys is None:
                rows = c.offset.shape[0]
                k, v = tree_map(lambda x: mx.zeros((rows, x.shape[1], 0, x.shape[3]), x.dtype),
                                (template.keys, template.values))
            else:
                k, v = c.keys, c.values
            left = max_idx - c.write_index
            right = max_size - k[0].shape[2] - left
            k, v = tree_map(lambda x: _pad_time(x, left, right), (k, v))
            return k, v, c.offset, c.left_padding + left

        (k1, v1, o1, l1), (k2, v2, o2, l2) = aligned(self), aligned(other)
        self.keys = tuple(mx.concatenate([a, b]) for a, b in zip(k1, k2))
        self.values = tuple(mx.concatenate([a, b]) for a, b in zip(v1, v2))
        self.offset = mx.concatenate([o1, o2])
        self.left_padding = mx.concatenate([l1, l2])
        self.write_index = max_idx

    def extract(self, idx: int) -> QuantizedSequenceCache:
        cache = QuantizedSequenceCache(self.bits, self.group_size)
        padding = self.left_padding.tolist()[idx]
        cache.keys, cache.values = tree_map(
            lambda x: mx.contiguous(x[idx: idx + 1, :, padding: self.write_index]),
            (self.keys, self.values))
        cache.offset = self.write_index - padding
        return cache

    @classmethod
    def merge(cls, caches: list[QuantizedSequenceCache]) -> QuantizedBatchKVCache:
        lengths = [c.size() for c in caches]
        max_length = max(lengths)
        bits, group_size = caches[0].bits, caches[0].group_size
        padding = [max_length - n for n in lengths]
        cache = cls(padding, bits, group_size)
        if max_length == 0:
            return cache
        for name in ("keys", "values"):
            held = [getattr(c, name) if c.keys is not None and c.offset else None
                    for c in caches]
            setattr(cache, name, tuple(
                _stack_rows([t[i] if t else None for t in held], padding, lengths)
                for i in range(3)))
        cache.offset += max_length
        cache.write_index = max_length
        return cache

    @property
    def state(self) -> tuple:
        return self.keys, self.values, self.offset, self.left_padding, self.write_index

    @state.setter
    def state(self, v: tuple) -> None:
        self.keys, self.values, self.offset, self.left_padding, self.write_index = v

    @property
    def nbytes(self) -> int:
        if self.keys is None:
            return 0
        return sum(x.nbytes for t in (self.keys, self.values) for x in t)


def _stack_rows(parts: list[mx.array | None], padding: list[int],
                lengths: list[int]) -> mx.array:
    """One part of the triples of each sequence, right-justified into a batch (zeros before)."""
    template = next(p for p in parts if p is not None)
    rows = []
    for part, pad, n in zip(parts, padding, lengths):
        shape = (1, template.shape[1], pad + n, template.shape[3])
        if part is None:
            rows.append(mx.zeros(shape, template.dtype))
        else:
            rows.append(_pad_time(part[..., :n, :], pad, 0))
    return mx.concatenate(rows)


def _pad_time(x: mx.array, left: int, right: int) -> mx.array:
    if right < 0:
        x, right = x[..., :right, :], 0
    if left == 0 and right == 0:
        return x
    return mx.pad(x, [(0, 0), (0, 0), (left, right), (0, 0)])


def _quantize(x: mx.array, bits: int) -> Triple:
    return tuple(mx.quantize(x, group_size=GROUP_SIZE, bits=bits))


def _requantize(triple: Triple, cache: QuantizedKVCache, bits: int) -> Triple:
    if cache.bits == bits and cache.group_size == GROUP_SIZE:
        return triple
    full = mx.dequantize(*triple, group_size=cache.group_size, bits=cache.bits)
    return _quantize(full, bits)


class KVLayout:
    """How the engine makes each sequence's cache: the model's own, or quantized layers."""

    def __init__(self, model: Any, cache_type: str = "f16"):
        self.model = model
        self.cache_type = cache_type
        self.bits = cache_bits(cache_type)
        if self.bits is not None:
            plain = make_prompt_cache(model)
            if not all(type(c) is KVCache for c in plain):
                kinds = sorted({type(c).__name__ for c in plain} - {"KVCache"})
                raise ValueError(f"a quantized KV cache needs a model whose layers all keep a "
                                 f"plain KV cache; this one has {', '.join(kinds)}")
            dims = _head_dims(model, len(plain))
            if any(d % GROUP_SIZE for d in dims):
                raise ValueError(f"a quantized KV cache quantizes groups of {GROUP_SIZE} values "
                                 f"of each head; this model's heads have {min(dims)}")
            self._n_layers = len(plain)

    @property
    def quantized(self) -> bool:
        return self.bits is not None

    def fresh(self) -> list[Any] | None:
        """A new sequence's cache; None lets BatchGenerator make the model's own."""
        if self.bits is None:
            return None
        return [QuantizedSequenceCache(self.bits) for _ in range(self._n_layers)]

    def adopt(self, cache: list[Any]) -> list[Any]:
        """A cache read from elsewhere (a slot file) in this engine's layout."""
        if self.bits is None:
            if any(isinstance(c, QuantizedKVCache) for c in cache):
                raise ValueError("a quantized slot file, and this server's KV cache is not")
            return cache
        return [QuantizedSequenceCache.of(c, self.bits) for c in cache]

    @staticmethod
    def portable(cache: list[Any]) -> list[Any]:
        """A cache as mlx-lm's own classes, for a slot file ``load_prompt_cache`` can read."""
        out = []
        for c in cache:
            if isinstance(c, QuantizedSequenceCache):
                plain = QuantizedKVCache(group_size=c.group_size, bits=c.bits)
                plain.keys, plain.values, plain.offset = c.keys, c.values, c.offset
                c = plain
            out.append(c)
        return out


class _ShapeProbe(KVCache):
    """Records the key and value widths a layer hands its cache, and keeps nothing."""

    def update_and_fetch(self, keys: mx.array, values: mx.array) -> tuple[mx.array, mx.array]:
        self.dims = (keys.shape[-1], values.shape[-1])
        return keys, values


def _head_dims(model: Any, n_layers: int) -> set[int]:
    """The head widths of the model's keys and values: one token through the model, built as a
    graph and never evaluated (only the shapes are read)."""
    probes = [_ShapeProbe() for _ in range(n_layers)]
    model(mx.array([[0]]), cache=probes)
    return {d for p in probes for d in getattr(p, "dims", ())}
