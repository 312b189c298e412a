"""Samplers and logits processors in llama.cpp's order and semantics, as small closures over MLX.

A ``Sampler`` maps the logits of one sequence, shape (1, vocab), to a token id array of shape
(1,). A ``LogitsProcessor`` maps (context tokens, logits) to logits; it runs before the sampler
(mlx-lm's contract, so both plug into ``BatchGenerator``).
"""

from __future__ import annotations

import random
from collections.abc import Callable

import mlx.core as mx

from .types import RANDOM_SEED, SamplingParams

Sampler = Callable[[mx.array], mx.array]
LogitsProcessor = Callable[[mx.array, mx.array], mx.array]
Filter = Callable[[mx.array], mx.array]

NEG_INF = float("-inf")


def greedy(logits: mx.array) -> mx.array:
    return mx.argmax(logits, axis=-1)


def top_k_filter(k: int) -> Filter:
    def apply(logits: mx.array) -> mx.array:
        if k >= logits.shape[-1]:
            return logits
        kth = mx.sort(logits, axis=-1)[..., -k][..., None]
        return mx.where(logits >= kth, logits, NEG_INF)

    return apply


def top_p_filter(p: float, min_keep: int) -> Filter:
    def apply(logits: mx.array) -> mx.array:
        order = mx.argsort(-logits, axis=-1)
        sorted_logits = mx.take_along_axis(logits, order, axis=-1)
        probs = mx.softmax(sorted_logits, axis=-1)
        before = mx.cumsum(probs, axis=-1) - probs  # mass of strictly better candidates
        ranks = mx.arange(probs.shape[-1])
        keep_sorted = (before < p) | (ranks < max(min_keep, 1))
        keep = mx.put_along_axis(mx.zeros_like(keep_sorted), order, keep_sorted, axis=-1)
        return mx.where(keep, logits, NEG_INF)

    return apply


def min_p_filter(p: float, min_keep: int) -> Filter:
    def apply(logits: mx.array) -> mx.array:
        top = mx.max(logits, axis=-1, keepdims=True)
        threshold = top + mx.log(mx.array(p, dtype=logits.dtype))
        keep = logits >= threshold
        if min_keep > 1:
            kth = mx.sort(logits, axis=-1)[..., -min(min_keep, logits.shape[-1])][..., None]
            keep = keep | (logits >= kth)
        return mx.where(keep, logits, NEG_INF)

    return apply


def typical_filter(p: float, min_keep: int) -> Filter:
    def apply(logits: mx.array) -> mx.array:
        logp = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
        probs = mx.exp(logp)
        entropy = -mx.nansum(probs * logp, axis=-1, keepdims=True)
        shift = mx.abs(-logp - entropy)
        order = mx.argsort(shift, axis=-1)
        sorted_probs = mx.take_along_axis(probs, order, axis=-1)
        before = mx.cumsum(sorted_probs, axis=-1) - sorted_probs
        ranks = mx.arange(probs.shape[-1])
        keep_sorted = (before < p) | (ranks < max(min_keep, 1))
        keep = mx.put_along_axis(mx.zeros_like(keep_sorted), order, keep_sorted, axis=-1)
        return mx.where(keep, logits, NEG_INF)

    return apply


def top_n_sigma_filter(n: float) -> Filter:
    def apply(logits: mx.array) -> mx.array:
        finite = logits > NEG_INF
        count = mx.maximum(mx.sum(finite, axis=-1, keepdims=True), 1)
        values = mx.where(finite, logits, 0.0)
        mean = mx.sum(values, axis=-1, keepdims=True) / count
        var = mx.sum(mx.where(finite, (logits - mean) ** 2, 0.0), axis=-1, keepdims=True) / count
        top = mx.max(logits, axis=-1, keepdims=True)
        return mx.where(logits >= top - n * mx.sqrt(var), logits, NEG_INF)

    return apply


def xtc_filter(probability: float, threshold: float, min_keep: int, rng: random.Random) -> Filter:
    """Exclude Top Choices: with some probability drop every candidate above the threshold but
    the least likely of them (llama.cpp's xtc)."""

    def apply(logits: mx.array) -> mx.array:
        if rng.random() >= probability:
            return logits
        probs = mx.softmax(logits, axis=-1)
        above = probs >= threshold
        if int(mx.sum(above).item()) < 2:
            return logits
        weakest_kept = mx.min(mx.where(above, probs, 2.0), axis=-1, keepdims=True)
        drop = above & (probs > weakest_kept)
        if int(mx.sum(~drop & (logits > NEG_INF)).item()) < max(min_keep, 1):
            return logits
        return mx.where(drop, NEG_INF, logits)

    return apply


def temperature_filter(temp: float, dyn_range: float, exponent: float) -> Filter:
    if dyn_range > 0:
        lo, hi = max(0.0, temp - dyn_range), temp + dyn_range

        def dynamic(logits: mx.array) -> mx.array:
            logp = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
            probs = mx.exp(logp)
            entropy = -mx.nansum(probs * logp, axis=-1, keepdims=True)
            n_finite = mx.sum(logits > NEG_INF, axis=-1, keepdims=True)
            max_entropy = mx.log(mx.maximum(n_finite, 2).astype(mx.float32))
            t = lo + (hi - lo) * mx.power(entropy / max_entropy, exponent)
            return logits / mx.maximum(t, 1e-6)

        return dynamic
    return lambda logits: logits / temp


def make_filters(p: SamplingParams, rng: random.Random) -> list[Filter]:
    """The chain's filters in the order of ``p.samplers`` (penalties run as processors)."""
    filters: list[Filter] = []
    for name in p.samplers:
        if name == "top_k" and p.top_k > 0:
            filters.append(top_k_filter(p.top_k))
        elif name == "top_p" and p.top_p < 1.0:
            filters.append(top_p_filter(p.top_p, p.min_keep))
        elif name == "min_p" and p.min_p > 0.0:
            filters.append(min_p_filter(p.min_p, p.min_keep))
        elif name == "typ_p" and p.typical_p < 1.0:
            filters.append(typical_filter(p.typical_p, p.min_keep))
        elif name == "top_n_sigma" and p.top_n_sigma > 0.0:
            filters.append(top_n_sigma_filter(p.top_n_sigma))
        elif name == "xtc" and p.xtc_probability > 0.0 and p.xtc_threshold <= 0.5:
            filters.append(xtc_filter(p.xtc_probability, p.xtc_threshold, p.min_keep, rng))
        elif name == "temperature" and p.temperature > 0.0:
            filters.append(temperature_filter(p.temperature, p.dynatemp_range, p.dynatemp_exponent))
    return filters


def resolve_seed(seed: int) -> int:
    return random.getrandbits(32) if seed == RANDOM_SEED else seed


def make_sampler(p: SamplingParams, seed: int) -> Sampler:
    """Greedy when the temperature is 0 (llama.cpp keeps only the top logit), else the chain."""
    if p.temperature <= 0.0:
        return greedy
    rng = random.Random(seed)
    filters = make_filters(p, rng)
    state = {"key": mx.random.key(seed)}

    def sample(logits: mx.array) -> mx.array:
        for f in filters:
            logits = f(logits)
        state["key"], sub = mx.random.split(state["key"])
        return mx.random.categorical(logits, axis=-1, key=sub)

    return sample


def logit_bias_processor(bias: list[tuple[int, float | None]], vocab_size: int) -> LogitsProcessor:
    ids = mx.array([t for t, _ in bias], dtype=mx.int32)
    values = mx.array([NEG_INF if b is None else b for _, b in bias], dtype=mx.float32)
    dense = mx.zeros((vocab_size,), dtype=mx.float32).at[ids].add(values)

    def apply(tokens: mx.array, logits: mx.array) -> mx.array:
        return logits + dense.astype(logits.dtype)

    return apply


def penalties_processor(p: SamplingParams) -> LogitsProcessor:
    """llama.cpp's penalties sampler: repeat (scales), frequency and presence (subtract) over the
    last ``repeat_last_n`` tokens of the context."""
    last_n = p.repeat_last_n

    def apply(tokens: mx.array, logits: mx.array) -> mx.array:
        window = tokens[-last_n:] if tokens.size > last_n else tokens
        if window.size == 0:
            return logits
        ids = window.astype(mx.int32)
        counts = mx.zeros((logits.shape[-1],), dtype=mx.float32).at[ids].add(1.0)
        seen = counts > 0
        out = logits
        if p.repeat_penalty != 1.0:
            scaled = mx.where(out <= 0, out * p.repeat_penalty, out / p.repeat_penalty)
            out = mx.where(seen, scaled, out)
        if p.frequency_penalty != 0.0 or p.presence_penalty != 0.0:
            out = out - counts * p.frequency_penalty - seen.astype(out.dtype) * p.presence_penalty
        return out

    return apply


def make_processors(p: SamplingParams, vocab_size: int) -> list[LogitsProcessor]:
    processors: list[LogitsProcessor] = []
    if p.logit_bias:
        processors.append(logit_bias_processor(p.logit_bias, vocab_size))
    penalties_active = p.repeat_last_n > 0 and (
        p.repeat_penalty != 1.0 or p.frequency_penalty != 0.0 or p.presence_penalty != 0.0
    )
    if "penalties" in p.samplers and penalties_active:
        processors.append(penalties_processor(p))
    return processors
