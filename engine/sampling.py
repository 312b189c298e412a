"""Samplers and logits processors in llama.cpp's order and semantics, as small closures over MLX.

A ``Sampler`` maps the logits of one sequence, shape (1, vocab), to a token id array of shape
(1,). A ``LogitsProcessor`` maps (context tokens, logits) to logits; it runs before the sampler
(mlx-lm's contract, so both plug into ``BatchGenerator``).
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable

import mlx.core as mx

from .numerics import scale
from .types import RANDOM_SEED, SamplingParams

Sampler = Callable[[mx.array], mx.array]
LogitsProcessor = Callable[[mx.array, mx.array], mx.array]
Filter = Callable[[mx.array], mx.array]

NEG_INF = float("-inf")


def greedy(logits: mx.array) -> mx.array:
    return mx.argmax(logits, axis=-1)


def kth_largest(logits: mx.array, k: int) -> mx.array:
    """Each row's k-th largest value (keepdims), by partition: the value a full sort puts
    there, without sorting the vocabulary."""
    at = logits.shape[-1] - k
    return mx.partition(logits, at, axis=-1)[..., at : at + 1]


def top_k_filter(k: int) -> Filter:
    def apply(logits: mx.array) -> mx.array:
        if k >= logits.shape[-1]:
            return logits
        return mx.where(logits >= kth_largest(logits, k), logits, NEG_INF)

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
            keep = keep | (logits >= kth_largest(logits, min(min_keep, logits.shape[-1])))
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
        above = (probs >= threshold) & (logits > NEG_INF)  # the candidates left, as llama.cpp
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

    sample.rng = state  # type: ignore[attr-defined]  # engine/batched_chain.py moves it on too
    return sample
