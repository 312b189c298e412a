"""Samplers and logits processors in llama.cpp's order and semantics, as small closures over MLX.

A ``Sampler`` maps the logits of one sequence, shape (1, vocab), to a token id array of shape
(1,). A ``LogitsProcessor`` maps (context tokens, logits) to logits; it runs before the sampler
(mlx-lm's contract, so both plug into ``BatchGenerator``).
"""

from __future__ import annotations

import functools
import math
import random
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import mlx.core as mx

from .numerics import cap, scale, subtract
from .types import RANDOM_SEED, ReasoningBudget, SamplingParams

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


def _entropy(probs: mx.array, logp: mx.array) -> mx.array:
    """Shannon entropy over the candidates left (0 * -inf counts as 0)."""
    return -mx.sum(mx.where(probs > 0, probs * logp, 0.0), axis=-1, keepdims=True)


def typical_filter(p: float, min_keep: int) -> Filter:
    def apply(logits: mx.array) -> mx.array:
        logp = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
        probs = mx.exp(logp)
        entropy = _entropy(probs, logp)
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
        # llama.cpp's test: a NaN bound (infinite n times a zero spread) removes nothing
        return mx.where(logits < top - n * mx.sqrt(var), NEG_INF, logits)

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
    lo, hi = max(0.0, temp - dyn_range), temp + dyn_range
    if dyn_range > 0 and hi > lo:

        def dynamic(logits: mx.array) -> mx.array:
            logp = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
            probs = mx.exp(logp)
            entropy = _entropy(probs, logp)
            n_finite = mx.sum(logits > NEG_INF, axis=-1, keepdims=True)
            max_entropy = mx.log(mx.maximum(n_finite, 2).astype(mx.float32))
            weight = mx.power(entropy / max_entropy, exponent)
            # no weight is no step above lo, even over an infinite range (not 0 * inf)
            return scale(logits, mx.where(weight > 0, lo + (hi - lo) * weight, lo))

        return dynamic
    return lambda logits: scale(logits, lo if dyn_range > 0 else temp)


def make_filter(name: str, p: SamplingParams, rng: random.Random) -> Filter | None:
    """One sampler of the chain that reads only the logits; None when it would change nothing
    (penalties, DRY and infill read more: engine/chain.py)."""
    if name == "top_k" and p.top_k > 0:
        return top_k_filter(p.top_k)
    if name == "top_p" and p.top_p < 1.0:
        return top_p_filter(p.top_p, p.min_keep)
    if name == "min_p" and p.min_p > 0.0:
        return min_p_filter(p.min_p, p.min_keep)
    if name == "typ_p" and p.typical_p < 1.0:
        return typical_filter(p.typical_p, p.min_keep)
    if name == "top_n_sigma" and p.top_n_sigma > 0.0:
        return top_n_sigma_filter(p.top_n_sigma)
    if name == "xtc" and p.xtc_probability > 0.0 and p.xtc_threshold <= 0.5:
        return xtc_filter(p.xtc_probability, p.xtc_threshold, p.min_keep, rng)
    if name == "temperature" and p.temperature > 0.0:
        return temperature_filter(p.temperature, p.dynatemp_range, p.dynatemp_exponent)
    return None


def resolve_seed(seed: int) -> int:
    return random.getrandbits(32) if seed == RANDOM_SEED else seed


# ---- the final pick: dist, mirostat 1 and 2, adaptive-p --------------------------------------
# A Picker draws the token from the filtered logits and also returns the candidates'
# probabilities after sampling (what post_sampling_probs reports). State that feeds back from the
# chosen token (mirostat's mu, adaptive-p's moving average) stays an MLX array: no host sync.
Picker = Callable[[mx.array, mx.array], tuple[mx.array, mx.array]]

LN2 = math.log(2.0)
ADAPTIVE_WIDTH, ADAPTIVE_PEAK, ADAPTIVE_SHARPNESS = 0.3, 5.0, 10.0


def dist(logits: mx.array, key: mx.array) -> tuple[mx.array, mx.array]:
    return mx.random.categorical(logits, axis=-1, key=key), mx.softmax(logits, axis=-1)


def _chosen(values: mx.array, token: mx.array) -> mx.array:
    return mx.take_along_axis(values, token[:, None], axis=-1)[:, 0]


def _draw_and_adapt_mu(kept: mx.array, key: mx.array, state: dict, tau: float,
                       eta: float) -> tuple[mx.array, mx.array]:
    """Both mirostats' last step: draw from the kept candidates, then move mu by eta times the
    surprise error (mu stays an MLX array, so no step waits on the host)."""
    token = mx.random.categorical(kept, axis=-1, key=key)
    final = mx.softmax(kept, axis=-1)
    surprise = -mx.log2(_chosen(final, token))
    state["mu"] = state["mu"] - eta * (surprise[0] - tau)
    mx.async_eval(state["mu"])
    return token, final


def mirostat_v1(tau: float, eta: float, n_vocab: int, m: int = 100) -> Picker:
    """llama.cpp's mirostat: estimate the Zipf exponent from the top m candidates, keep the top k
    that target the surprise mu, sample, then move mu by eta times the surprise error."""
    state = {"mu": mx.array(2.0 * tau)}

    def pick(logits: mx.array, key: mx.array) -> tuple[mx.array, mx.array]:
        probs = mx.softmax(logits, axis=-1)
        sorted_p = -mx.sort(-probs, axis=-1)
        lim = max(1, min(m - 1, sorted_p.shape[-1] - 1))
        i = mx.arange(lim, dtype=mx.float32)
        t = mx.log((i + 2) / (i + 1))
        b = mx.log(sorted_p[..., :lim] / sorted_p[..., 1 : lim + 1])
        s_hat = mx.sum(t * b, axis=-1, keepdims=True) / mx.sum(t * t)
        eps = s_hat - 1
        k = mx.power(eps * mx.power(2.0, state["mu"]) / (1 - mx.power(float(n_vocab), -eps)),
                     1 / s_hat)
        k = mx.where((k >= 1) & (k < 2.0**31), mx.floor(k), 1.0)  # C's max(int(k), 1)
        k = mx.minimum(k, sorted_p.shape[-1])
        kth = mx.take_along_axis(sorted_p, (k.astype(mx.int32) - 1), axis=-1)
        kept = mx.where(probs >= kth, logits, NEG_INF)
        return _draw_and_adapt_mu(kept, key, state, tau, eta)

    return pick


def mirostat_v2(tau: float, eta: float) -> Picker:
    """llama.cpp's mirostat v2: drop candidates whose surprise exceeds mu (keep at least one)."""
    state = {"mu": mx.array(2.0 * tau)}

    def pick(logits: mx.array, key: mx.array) -> tuple[mx.array, mx.array]:
        logp = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
        top = mx.max(logp, axis=-1, keepdims=True)
        keep = ~(-logp / LN2 > state["mu"]) | (logp >= top)  # a NaN mu keeps all, as in C
        kept = mx.where(keep, logits, NEG_INF)
        return _draw_and_adapt_mu(kept, key, state, tau, eta)

    return pick


def adaptive_p(target: float, decay: float) -> Picker:
    """llama.cpp's adaptive-p: reshape the distribution around an adapted target probability
    (2 * target minus the moving average of the chosen tokens' original probabilities)."""
    if target < 0:
        return dist
    decay = min(max(decay, 0.0), 0.99)
    state = {"sum": mx.array(target / (1 - decay)), "weight": mx.array(1 / (1 - decay))}
    goal = min(max(target, 0.0), 1.0)

    def pick(logits: mx.array, key: mx.array) -> tuple[mx.array, mx.array]:
        probs = mx.softmax(logits, axis=-1)
        adapted = mx.clip(2 * goal - state["sum"] / state["weight"], 0.0, 1.0)
        d = mx.abs(probs - adapted) / ADAPTIVE_WIDTH
        shaped = mx.where(logits > NEG_INF, ADAPTIVE_PEAK - ADAPTIVE_SHARPNESS * d * d / (1 + d),
                          NEG_INF)
        token = mx.random.categorical(shaped, axis=-1, key=key)
        state["sum"] = _chosen(probs, token)[0] + decay * state["sum"]
        state["weight"] = 1 + decay * state["weight"]
        mx.async_eval(state["sum"], state["weight"])
        return token, mx.softmax(shaped, axis=-1)

    return pick


def make_sampler(p: SamplingParams, seed: int, n_vocab: int,
                 record: Callable[[mx.array], None] | None = None) -> Sampler:
    """The draw, once the chain (engine/chain.py, the last logits processor) has filtered the
    logits: greedy at a zero temperature, mirostat after its own temperature (llama.cpp's
    common_sampler_init replaces the chain with the two), adaptive-p when ``samplers`` lists it,
    else dist. ``record`` receives the candidates' probabilities after each draw
    (post_sampling_probs)."""
    if p.temperature <= 0.0 and (p.mirostat or "temperature" in p.samplers):
        return greedy
    filters: list[Filter] = []
    if p.mirostat:
        filters.append(lambda logits: scale(logits, p.temperature))
        pick = (mirostat_v1(p.mirostat_tau, p.mirostat_eta, n_vocab) if p.mirostat == 1
                else mirostat_v2(p.mirostat_tau, p.mirostat_eta))
    else:
        pick = adaptive_p(p.adaptive_target, p.adaptive_decay) if (
            "adaptive_p" in p.samplers) else dist
    state = {"key": mx.random.key(seed)}

    def sample(logits: mx.array) -> mx.array:
        for f in filters:
            logits = f(logits)
        state["key"], sub = mx.random.split(state["key"])
        token, probs = pick(logits, sub)
        if record is not None:
            record(probs)
        return token

    return sample


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


# ---- reasoning budget (llama.cpp's common/reasoning-budget) ----------------------------------
# A budget is idle until its start tag is generated, then counts the tokens that follow; when they
# run out (and the last one ends a UTF-8 character) it forces its end sequence one token at a
# time. Generating an end tag first ends it naturally. A start tag after the end opens it again.
IDLE, COUNTING, WAITING_UTF8, FORCING, DONE = "idle", "counting", "waiting_utf8", "forcing", "done"
WHITESPACE = b" \t\n\v\f\r"


def piece_ends_character(piece: bytes) -> bool:
    """common_utf8_is_complete on one token's piece: it ends on a character boundary (a piece of
    continuation bytes only does not)."""
    for back in range(1, min(4, len(piece)) + 1):
        byte = piece[-back]
        if byte & 0xC0 != 0x80:
            need = 4 if byte >= 0xF0 else 3 if byte >= 0xE0 else 2 if byte >= 0xC0 else 1
            return back >= need
    return not piece


class TagMatcher:
    """Sees any of several token sequences end in a token stream, and then forgets what it has
    seen (what llama.cpp's Aho-Corasick matcher reports, matching from its root again)."""

    def __init__(self, sequences: list[list[int]]):
        self.sequences = {tuple(s) for s in sequences if s}
        self.recent: deque[int] = deque(maxlen=max(map(len, self.sequences), default=1))
        self.matched: tuple[int, ...] = ()  # the sequence seen last

    def advance(self, token: int) -> bool:
        self.recent.append(token)
        tail = tuple(self.recent)
        for sequence in self.sequences:
            if tail[-len(sequence):] == sequence:
                self.recent.clear()
                self.matched = sequence
                return True
        return False

    def reset(self) -> None:
        self.recent.clear()


@dataclass
class BudgetState:
    """One sequence's reasoning budget: ``accept`` each generated token, then ``forced_token``
    says which token the next step must take (None: any). A lazy grammar is held off while the
    budget is ``active`` (llama.cpp's grammar_should_apply): it is not fed a token accepted while
    active (``held_last``), but is fed the end tag that ended the budget (``replay``)."""

    budget: int
    start: TagMatcher
    end: TagMatcher
    forced: list[int]
    pieces: list[bytes] = field(repr=False)  # per token id, special ones empty: UTF-8 check
    phase: str = IDLE
    remaining: int = 0
    force_pos: int = 0
    held_last: bool = False
    replay: tuple[int, ...] = ()

    @property
    def active(self) -> bool:
        return self.phase in (COUNTING, WAITING_UTF8, FORCING)

    def accept(self, token: int) -> None:
        self.held_last, self.replay = self.active, ()
        self._advance(token)

    def _advance(self, token: int) -> None:
        if self.phase in (IDLE, DONE):
            if self.start.advance(token):
                self._open()
        elif self.phase in (COUNTING, WAITING_UTF8):
            if self.end.advance(token):
                self.phase, self.replay = DONE, self.end.matched
            elif self.phase == COUNTING:
                self.remaining -= 1
                if self.remaining <= 0 and self._ends_character(token):
                    self._force()
                elif self.remaining <= 0:
                    self.phase = WAITING_UTF8
                    self.end.reset()
            elif self._ends_character(token):
                self._force()
        elif self.phase == FORCING:
            self.force_pos += 1
            if self.force_pos >= len(self.forced):
                self.phase = DONE

    def forced_token(self) -> int | None:
        if self.phase == FORCING and self.force_pos < len(self.forced):
            return self.forced[self.force_pos]
        return None

    def _ends_character(self, token: int) -> bool:
        return piece_ends_character(self.pieces[token] if 0 <= token < len(self.pieces) else b"")

    def _open(self) -> None:
        self.phase, self.remaining = COUNTING, self.budget
        self.end.reset()
        if self.remaining <= 0:
            self._force()

    def _force(self) -> None:
        self.phase, self.force_pos = FORCING, 0
        self.end.reset()


def prefill_tokens(generation_prompt: str, tokenize: Callable[[str], list[int]],
                   special_pieces: list[bytes]) -> list[int]:
    """The generation prompt's tokens, less a first token that only a tokenizer's leading space
    put there (common_sampler_init's prefill)."""
    tokens = tokenize(generation_prompt) if generation_prompt else []
    if tokens and _starts_with_space(special_pieces[tokens[0]]) and not _starts_with_space(
            generation_prompt.encode()):
        tokens = tokens[1:]
    return tokens


def _starts_with_space(text: bytes) -> bool:
    return bool(text) and text[0] in WHITESPACE


def budget_state(rb: ReasoningBudget, pieces: list[bytes], prefill: list[int]) -> BudgetState:
    state = BudgetState(rb.tokens, TagMatcher([rb.start]), TagMatcher(rb.ends), list(rb.forced),
                        pieces)
    for token in prefill:
        state.accept(token)
    return state


def reasoning_budget_processor(state: BudgetState) -> LogitsProcessor:
    """The budget as a logits processor (llama.cpp applies it first, to the raw logits): mlx-lm
    passes the context, which ends with a prompt token at the first step and then with the token
    sampled at the step before, accepted here; while forcing, every other token gets -inf."""
    started = False

    def apply(tokens: mx.array, logits: mx.array) -> mx.array:
        nonlocal started
        if started:
            state.accept(int(tokens[-1].item()))
        started = True
        forced = state.forced_token()
        if forced is None:
            return logits
        return mx.where(mx.arange(logits.shape[-1]) == forced, logits, NEG_INF)

    return apply
