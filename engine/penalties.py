"""Logits processors before the sampler, in llama.cpp's semantics, as closures over MLX: the
logit bias (and the greedy sampler that folds a lone bias into one shared call), the penalties
sampler (repeat, frequency, presence) and DRY. A ``LogitsProcessor`` maps (context tokens,
logits) to logits (mlx-lm's contract, so they plug into ``BatchGenerator``).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

import mlx.core as mx

from .numerics import cap, subtract
from .sampling import NEG_INF, LogitsProcessor, Sampler, greedy
from .types import SamplingParams


def recorder(record: Callable[[mx.array], None]) -> LogitsProcessor:
    """A first logits processor that hands its input, the raw logits, to ``record``."""

    def apply(tokens: mx.array, logits: mx.array) -> mx.array:
        record(logits)
        return logits

    return apply


def _dense_bias(bias: list[tuple[int, float | None]], vocab_size: int
                ) -> Callable[[int], mx.array]:
    """The bias as a dense row, for logits of any width: a model's logits can be wider than its
    tokenizer's vocabulary (padded embeddings); the extra columns get no bias."""
    ids = mx.array([t for t, _ in bias], dtype=mx.int32)
    bans = [b is None or b == NEG_INF for _, b in bias]
    values = mx.array([0.0 if ban else b for (_, b), ban in zip(bias, bans)], dtype=mx.float32)
    banned = mx.zeros((vocab_size,), dtype=mx.int32).at[ids].add(mx.array(bans, dtype=mx.int32))
    # a token's biases add up, capped (two huge ones do not make +inf, nor +inf - inf a NaN)
    total = mx.zeros((vocab_size,), dtype=mx.float32).at[ids].add(values)
    dense = mx.where(banned > 0, NEG_INF, cap(mx.where(mx.isnan(total), 0.0, total)))
    by_width = {vocab_size: dense}

    def row(width: int) -> mx.array:
        if width not in by_width:
            by_width[width] = dense[:width] if width < vocab_size else mx.concatenate(
                [dense, mx.zeros((width - vocab_size,), dtype=mx.float32)])
        return by_width[width]

    return row


def logit_bias_processor(bias: list[tuple[int, float | None]], vocab_size: int) -> LogitsProcessor:
    row = _dense_bias(bias, vocab_size)

    def apply(tokens: mx.array, logits: mx.array) -> mx.array:
        return cap(logits + row(logits.shape[-1]).astype(logits.dtype))

    return apply


@functools.lru_cache(maxsize=64)
def greedy_with_bias(bias: tuple[tuple[int, float | None], ...], vocab_size: int) -> Sampler:
    """Greedy after a logit bias, one shared sampler per distinct bias: mlx-lm's batch samples
    sequences that share a sampler in one call, and a sequence without logits processors skips
    its per-sequence loop (``ignore_eos`` alone is such a bias). The argmax of the normalised
    logits plus the bias equals that of the biased logits, so the token is the same."""
    row = _dense_bias(list(bias), vocab_size)

    def sample(logprobs: mx.array) -> mx.array:
        return mx.argmax(logprobs + row(logprobs.shape[-1]).astype(logprobs.dtype), axis=-1)

    sample.shared = True  # type: ignore[attr-defined]
    return sample


def is_shared(sampler: Sampler) -> bool:
    """A sampler several sequences may share: stateless, so the batch samples them in one call
    (a failure there fails the step, not one sequence, so it must not depend on the request)."""
    return sampler is greedy or getattr(sampler, "shared", False)


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
            out = cap(mx.where(seen, scaled, out))
        if p.frequency_penalty != 0.0 or p.presence_penalty != 0.0:
            out = subtract(out, counts * p.frequency_penalty
                           + seen.astype(mx.float32) * p.presence_penalty)
        return out

    return apply


# ---- DRY (llama.cpp's "Don't Repeat Yourself", from koboldcpp) --------------------------------
DRY_MAX_BREAKER_BYTES = 40
DRY_MAX_TAIL_TOKENS = 20
Breakers = dict[int, list[tuple[int, ...]]]  # head token -> token tails that complete a breaker


def dry_breakers(pieces: list[bytes], tokenize: Callable[[str], list[int]],
                 breakers: list[str]) -> Breakers:
    """Every token whose piece contains a breaker (empty tail), or ends with the start of one
    (the rest of the breaker, tokenized, as its tail): get_overlapping_token_sequences."""
    table: Breakers = {}
    for breaker in breakers:
        word = breaker.encode()[:DRY_MAX_BREAKER_BYTES]
        if not word:
            continue
        for tid, piece in enumerate(pieces):
            tails = table.setdefault(tid, [])
            if word in piece:
                if () not in tails:
                    tails.append(())
                continue
            pos = piece.find(word[:1])
            while pos >= 0:
                n = min(len(word), len(piece) - pos)
                if piece[pos : pos + n] == word[:n]:
                    rest = word[n:].decode("utf-8", "ignore")
                    tail = tuple(tokenize(rest)[:DRY_MAX_TAIL_TOKENS])
                    if tail not in tails:
                        tails.append(tail)
                pos = piece.find(word[:1], pos + 1)
            if not tails:
                del table[tid]
    return table


def _dry_repeat_limit(last: list[int], breakers: Breakers) -> int:
    """How far back a repeat may reach: up to the most recent sequence breaker."""
    n = len(last)
    for i in range(n):
        tails = breakers.get(last[n - 1 - i])
        if not tails:
            continue
        longest = -1
        for tail in tails:
            if longest < len(tail) <= i and all(
                tail[k] == last[n - 1 - (i - k - 1)] for k in range(len(tail))
            ):
                longest = len(tail)
        if longest >= 0:
            return i - longest
    return n


def dry_penalties(last: list[int], multiplier: float, base: float, allowed_length: int,
                  breakers: Breakers) -> dict[int, float]:
    """The DRY penalty per token that would extend a repeat of at least ``allowed_length``
    tokens of ``last`` (the penalty window, oldest first): multiplier * base^(len - allowed)."""
    n = len(last)
    if n <= allowed_length:
        return {}
    limit = _dry_repeat_limit(last, breakers)
    if limit < allowed_length:
        return {}
    rev = last[::-1]  # rev[0] is the newest token
    # z[k]: how many tokens ending k steps back match the tokens at the end (reverse Z-algorithm)
    z = [0] * n
    left = right = 0
    for k in range(1, n):
        if k > right:
            m = 0
            while k + m < n and rev[m] == rev[k + m]:
                m += 1
            z[k] = m
            if m > 0:
                left, right = k, k + m - 1
        elif z[k - left] < right - k + 1:
            z[k] = z[k - left]
        else:
            i = right + 1
            while i < n and rev[i] == rev[i - k]:
                i += 1
            z[k] = i - k
            left, right = k, i - 1
    longest: dict[int, int] = {}
    for k in range(1, n):
        length = min(z[k], limit)
        if length >= allowed_length:
            token = rev[k - 1]  # the token that followed that earlier occurrence
            longest[token] = max(longest.get(token, 0), length)
    max_exponent = int(88.7228391 / math.log(base)) if base > 1.000001 else 0
    out: dict[int, float] = {}
    for token, length in longest.items():
        if () in breakers.get(token, ()):
            continue  # a single-token breaker is never penalized
        exponent = length - allowed_length
        if max_exponent > 0:
            exponent = min(exponent, max_exponent)
        out[token] = multiplier * base**exponent
    return out


def dry_processor(p: SamplingParams, breakers: Breakers) -> LogitsProcessor:
    last_n = p.dry_penalty_last_n

    def apply(tokens: mx.array, logits: mx.array) -> mx.array:
        window = tokens[-last_n:].tolist()
        penalties = dry_penalties(window, p.dry_multiplier, p.dry_base, p.dry_allowed_length,
                                  breakers)
        if not penalties:
            return logits
        ids = mx.array(list(penalties), dtype=mx.int32)
        values = mx.array(list(penalties.values()), dtype=mx.float32)
        dense = mx.zeros((logits.shape[-1],), dtype=mx.float32).at[ids].add(values)
        return subtract(logits, dense.astype(logits.dtype))

    return apply


def dry_active(p: SamplingParams) -> bool:
    return (p.mirostat == 0 and "dry" in p.samplers and p.dry_multiplier != 0.0
            and p.dry_base >= 1.0 and p.dry_penalty_last_n > 0)


def penalties_active(p: SamplingParams) -> bool:
    return p.mirostat == 0 and "penalties" in p.samplers and p.repeat_last_n > 0 and (
        p.repeat_penalty != 1.0 or p.frequency_penalty != 0.0 or p.presence_penalty != 0.0)


def make_processors(p: SamplingParams, vocab_size: int) -> list[LogitsProcessor]:
    """The logit bias, first of llama.cpp's chain (the rest, after the grammar: chain.py)."""
    return [logit_bias_processor(p.logit_bias, vocab_size)] if p.logit_bias else []
