"""llama.cpp's sampler chain in plain numpy, written from its description (the reference's
src/llama-sampler.cpp and common/sampling.cpp as the spec reads them), independently of
engine/: the hand-computed expectations the chain tests compare the server's post-sampling
candidates with.

Candidates are an array of ids and one of logits, as llama.cpp's ``llama_token_data_array``: a
sampler either drops candidates (top-k, top-p, min-p, typical, XTC, mirostat) or sets logits to
-inf in place (a zero temperature, top-n-sigma, the logit bias's bans).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

DEFAULT_SAMPLERS = ["penalties", "dry", "top_n_sigma", "top_k", "typ_p", "top_p", "min_p", "xtc",
                    "temperature"]
DEFAULTS = {"temperature": 0.8, "dynatemp_range": 0.0, "dynatemp_exponent": 1.0, "top_k": 40,
            "top_p": 0.95, "min_p": 0.05, "top_n_sigma": -1.0, "typical_p": 1.0,
            "xtc_probability": 0.0, "xtc_threshold": 0.1, "repeat_last_n": 64,
            "repeat_penalty": 1.0, "presence_penalty": 0.0, "frequency_penalty": 0.0,
            "dry_multiplier": 0.0, "dry_base": 1.75, "dry_allowed_length": 2,
            "dry_penalty_last_n": 64, "dry_sequence_breakers": ["\n", ":", '"', "*"],
            "mirostat": 0, "mirostat_tau": 5.0, "mirostat_eta": 0.1, "adaptive_target": -1.0,
            "adaptive_decay": 0.9, "min_keep": 0, "logit_bias": [],
            "samplers": DEFAULT_SAMPLERS}


@dataclass
class Vocabulary:
    """What the samplers read of the model's vocabulary."""

    pieces: list[bytes]  # special tokens as their text (DRY's sequence breakers)
    text_pieces: list[bytes]  # special tokens empty (infill's prefix test)
    eog: set[int]
    eot: int


@dataclass
class Cands:
    ids: np.ndarray
    logits: np.ndarray

    def probs(self) -> np.ndarray:
        return softmax(self.logits)

    def take(self, order) -> None:
        self.ids, self.logits = self.ids[order], self.logits[order]

    def sort(self) -> None:
        self.take(np.argsort(-self.logits, kind="stable"))


@dataclass
class State:
    """What a sampler carries from one step to the next."""

    mu: float | None = None  # mirostat
    ema_sum: float | None = None  # adaptive-p's weighted sum and total weight
    ema_weight: float | None = None
    notes: dict = field(default_factory=dict)  # what a step computed (k, branch, ...)


def softmax(logits: np.ndarray) -> np.ndarray:
    finite = logits > -np.inf
    out = np.zeros_like(logits, dtype=np.float64)
    if finite.any():
        e = np.exp(logits[finite] - logits[finite].max())
        out[finite] = e / e.sum()
    return out


# ---- the samplers ------------------------------------------------------------------------------
def top_k(c: Cands, k: int) -> None:
    if k > 0:
        c.sort()
        c.take(slice(0, min(k, c.ids.size)))


def top_p(c: Cands, p: float, min_keep: int) -> None:
    if p >= 1.0:
        return
    c.sort()
    cum = np.cumsum(c.probs())
    last = next((i + 1 for i in range(cum.size) if cum[i] >= p and i + 1 >= min_keep), cum.size)
    c.take(slice(0, last))


def min_p(c: Cands, p: float, min_keep: int) -> None:
    if p <= 0.0:
        return
    c.sort()
    threshold = c.logits[0] + math.log(p)
    keep = max(int((c.logits >= threshold).sum()), min_keep, 1)
    c.take(slice(0, keep))


def typical(c: Cands, p: float, min_keep: int) -> None:
    if p >= 1.0:
        return
    c.sort()
    probs = c.probs()
    entropy = -sum(q * math.log(q) for q in probs if q > 0)
    shifted = np.abs(-np.log(probs) - entropy)
    order = np.argsort(shifted, kind="stable")
    cum, last = 0.0, order.size
    for i, j in enumerate(order):
        cum += probs[j]
        if cum > p and (min_keep == 0 or i >= min_keep - 1):
            last = i + 1
            break
    c.take(order[:last])


def top_n_sigma(c: Cands, n: float) -> None:
    finite = c.logits > -np.inf
    if n <= 0 or c.ids.size <= 1 or not finite.any():
        return
    values = c.logits[finite]
    cut = values.max() - n * values.std()
    c.logits = np.where(c.logits < cut, -np.inf, c.logits)


def xtc(c: Cands, probability: float, threshold: float, min_keep: int) -> None:
    """With probability 1 (the only value a test can expect): every candidate above the
    threshold but the least likely of them leaves."""
    if probability <= 0 or threshold > 0.5 or c.ids.size < 2:
        return
    assert probability >= 1.0, "a random XTC cannot be expected"
    c.sort()
    probs = c.probs()
    above = 0
    while above < probs.size and probs[above] >= threshold:
        above += 1
    drop = above - 1
    if drop > 0 and c.ids.size - drop >= min_keep:
        c.take(slice(drop, None))


def temperature(c: Cands, t: float, dyn_range: float = 0.0, exponent: float = 1.0) -> None:
    if dyn_range > 0:
        if c.ids.size <= 1:
            return
        lo, hi = max(0.0, t - dyn_range), t + dyn_range
        probs = c.probs()
        entropy = -sum(q * math.log(q) for q in probs if q > 0)
        t = lo + (hi - lo) * (entropy / math.log(c.ids.size)) ** exponent
    if t <= 0:
        top = int(np.argmax(c.logits))
        c.logits = np.where(np.arange(c.ids.size) == top, c.logits, -np.inf)
    else:
        c.logits = c.logits / t


def penalties(c: Cands, context: list[int], last_n: int, repeat: float, freq: float,
              present: float) -> None:
    if last_n == 0 or (repeat == 1.0 and freq == 0.0 and present == 0.0):
        return
    window = context[-last_n:]
    counts = {t: window.count(t) for t in set(window)}
    for i, token in enumerate(c.ids.tolist()):
        n = counts.get(token, 0)
        if n:
            x = c.logits[i]
            x = x * repeat if x <= 0 else x / repeat
            c.logits[i] = x - n * freq - present


def dry(c: Cands, context: list[int], vocab: Vocabulary, multiplier: float, base: float,
        allowed: int, last_n: int, breakers: list[str]) -> None:
    """Brute force, for single-character breakers (a token is a breaker when its text holds
    one): the longest suffix of the window that also ends earlier in it, up to the last
    breaker, penalizes the token that followed that earlier occurrence."""
    if multiplier == 0.0 or base < 1.0 or last_n == 0:
        return
    assert all(len(b.encode()) == 1 for b in breakers), "multi-character breakers: not here"
    window = context[-last_n:]
    n = len(window)
    if n <= allowed:
        return
    is_breaker = {t for t, piece in enumerate(vocab.pieces)
                  if any(b.encode() in piece for b in breakers)}
    limit = next((i for i in range(n) if window[n - 1 - i] in is_breaker), n)
    if limit < allowed:
        return
    longest: dict[int, int] = {}
    for k in range(1, n):  # an earlier occurrence ending k tokens before the last one
        m = 0
        while m + k < n and window[n - 1 - m] == window[n - 1 - k - m]:
            m += 1
        m = min(m, limit)
        if m >= allowed:
            follower = window[n - k]
            longest[follower] = max(longest.get(follower, 0), m)
    cap = int(88.7228391 / math.log(base)) if base > 1.000001 else 0
    for i, token in enumerate(c.ids.tolist()):
        if token in longest and token not in is_breaker:
            exponent = longest[token] - allowed
            if cap > 0:
                exponent = min(exponent, cap)
            c.logits[i] -= multiplier * base ** exponent


def infill(c: Cands, vocab: Vocabulary, state: State) -> None:
    c.sort()
    probs = c.probs().astype(np.float32)
    eog = np.array([t in vocab.eog for t in c.ids.tolist()], dtype=bool)
    if 3 * probs[eog].sum() * c.ids.size > probs[~eog].sum():
        state.notes["infill"] = "end of generation only"
        c.take(np.flatnonzero(eog))
        return
    pieces = [vocab.text_pieces[t] for t in c.ids.tolist()]
    alive = c.logits > -np.inf
    for a in range(len(pieces)):
        for b in range(len(pieces)):
            if not alive[a]:
                break
            if a == b or not alive[b]:
                continue
            if pieces[a] and pieces[b].startswith(pieces[a]):
                dst, src = (b, a) if probs[b] > probs[a] else (a, b)
                probs[dst] += probs[src]
                probs[src] = 0.0
                alive[src] = False
    state.notes["merged"] = int((~alive).sum())
    kept = alive & ((probs >= 0.2) | eog)
    n_text = int((kept & ~eog).sum())
    if n_text == 0:
        state.notes["infill"] = "end of text"
        c.ids, c.logits = np.array([vocab.eot]), np.array([1.0])
        return
    share = probs / probs[kept].sum()
    kept &= (share >= 1.0 / (n_text + 1)) | eog
    state.notes["infill"] = "text"
    c.take(np.flatnonzero(kept))


def mirostat_v1(c: Cands, tau: float, n_vocab: int, state: State, m: int = 100) -> None:
    c.sort()
    probs = c.probs()
    lim = min(m - 1, c.ids.size - 1)
    t = np.log(np.arange(2, lim + 2) / np.arange(1, lim + 1))
    b = np.log(probs[:lim] / probs[1:lim + 1])
    s_hat = float((t * b).sum() / (t * t).sum())
    eps = s_hat - 1
    k = (eps * 2.0 ** state.mu / (1 - n_vocab ** -eps)) ** (1 / s_hat)
    state.notes["k"] = k
    c.take(slice(0, max(int(k), 1)))


def mirostat_v2(c: Cands, state: State) -> None:
    c.sort()
    surprise = -np.log2(c.probs())
    keep = next((i for i in range(surprise.size) if surprise[i] > state.mu), surprise.size)
    c.take(slice(0, max(keep, 1)))


def adaptive_p(c: Cands, target: float, state: State) -> None:
    """The draw's distribution: each candidate's logit becomes a function of how far its
    probability is from the adapted target."""
    probs = c.probs()
    state.notes["original"] = dict(zip(c.ids.tolist(), probs.tolist()))
    goal = min(max(target, 0.0), 1.0)
    adapted = min(max(2 * goal - state.ema_sum / state.ema_weight, 0.0), 1.0)
    d = np.abs(probs - adapted) / 0.3
    c.logits = np.where(c.logits > -np.inf, 5.0 - 10.0 * d * d / (1 + d), -np.inf)


# ---- the chain ---------------------------------------------------------------------------------
def post_sampling(logits: np.ndarray, context: list[int], body: dict, vocab: Vocabulary,
                  state: State | None = None) -> list[tuple[int, float]]:
    """The candidates the chain leaves before the draw with their probabilities, most likely
    first, those of probability 0 left out: what post_sampling_probs reports. ``state`` holds
    mirostat's mu and adaptive-p's average (initial values when None)."""
    p = {**DEFAULTS, **body}
    state = state or State()
    c = Cands(np.arange(logits.size), logits.astype(np.float64).copy())
    for token, bias in p["logit_bias"]:
        c.logits[token] += -np.inf if bias is False else bias
    if p["mirostat"]:
        temperature(c, p["temperature"])
        if state.mu is None:
            state.mu = 2 * p["mirostat_tau"]
        if p["mirostat"] == 1:
            mirostat_v1(c, p["mirostat_tau"], logits.size, state)
        else:
            mirostat_v2(c, state)
        return _listed(c)
    for name in p["samplers"]:
        if name == "penalties":
            penalties(c, context, p["repeat_last_n"], p["repeat_penalty"],
                      p["frequency_penalty"], p["presence_penalty"])
        elif name == "dry":
            dry(c, context, vocab, p["dry_multiplier"], p["dry_base"], p["dry_allowed_length"],
                p["dry_penalty_last_n"], p["dry_sequence_breakers"])
        elif name == "top_k":
            top_k(c, p["top_k"])
        elif name == "top_p":
            top_p(c, p["top_p"], p["min_keep"])
        elif name == "min_p":
            min_p(c, p["min_p"], p["min_keep"])
        elif name == "typ_p":
            typical(c, p["typical_p"], p["min_keep"])
        elif name == "top_n_sigma":
            top_n_sigma(c, p["top_n_sigma"])
        elif name == "xtc":
            xtc(c, p["xtc_probability"], p["xtc_threshold"], p["min_keep"])
        elif name == "temperature":
            temperature(c, p["temperature"], p["dynatemp_range"], p["dynatemp_exponent"])
        elif name == "infill":
            infill(c, vocab, state)
    if "adaptive_p" in p["samplers"] and p["adaptive_target"] >= 0:
        decay = min(max(p["adaptive_decay"], 0.0), 0.99)
        if state.ema_sum is None:
            state.ema_sum = p["adaptive_target"] / (1 - decay)
            state.ema_weight = 1 / (1 - decay)
        adaptive_p(c, p["adaptive_target"], state)
    return _listed(c)


def _listed(c: Cands) -> list[tuple[int, float]]:
    probs = c.probs()
    order = np.argsort(-probs, kind="stable")
    return [(int(c.ids[i]), float(probs[i])) for i in order if probs[i] > 0]
