"""Sampled sequences whose chains have the same settings, drawn in one batched call per step.

A sequence whose chain reads only its logits (top_k, typ_p, top_p, min_p, top_n_sigma,
temperature, after an optional logit bias) and then draws with ``dist`` gets a ``BatchedDraw``
shared by every sequence of the same settings. The engine's generation batch
(engine/batching.py) then runs those sequences' chain and draw on their rows at once; each keeps
its own RNG key (the state its per-sequence sampler splits, engine/sampling.py's
``make_sampler``), so the tokens are those the sequence alone would draw: the filters are
row-wise, and the draw reproduces ``mx.random.categorical`` on one row (MLX's inverse-CDF path
for a single distribution: ``searchsorted`` of a uniform in the exclusive cumulative sum) with a
per-row key. A sequence with any other step (penalties, DRY, XTC, infill, a grammar, mirostat,
adaptive-p, recorded probabilities) keeps its own chain.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, replace

import mlx.core as mx

from .penalties import dry_active, logit_bias_processor, penalties_active
from .sampling import NEG_INF, Filter, make_filter, top_p_filter
from .types import SamplingParams

BATCHABLE = frozenset({"top_k", "typ_p", "top_p", "min_p", "top_n_sigma", "temperature"})
# what the batchable filters read of SamplingParams
FILTER_FIELDS = ("top_k", "top_p", "min_p", "min_keep", "typical_p", "top_n_sigma",
                 "temperature", "dynatemp_range", "dynatemp_exponent")
MAX_SHARED = 64
RngState = dict  # {"key": mx.array}, the per-sequence sampler's, split once per draw


@dataclass(frozen=True)
class BatchedDraw:
    """The chain and the draw of one set of settings, over any number of rows."""

    steps: tuple[Filter, ...]
    bias: Callable[[mx.array, mx.array], mx.array] | None

    def __call__(self, logits: mx.array, keys: mx.array) -> tuple[mx.array, mx.array,
                                                                   mx.array]:
        """Tokens (k,), the rows' next keys (k, 2) and the normalized logits the tokens were
        drawn from (k, vocab), from raw logits (k, vocab) and each row's key (k, 2)."""
        x = logits if self.bias is None else self.bias(None, logits)
        for step in self.steps:
            x = step(x)
        logprobs = x - mx.logsumexp(x, axis=-1, keepdims=True)  # as mlx-lm normalizes
        split = mx.vmap(lambda key: mx.random.split(key))(keys)
        return _inverse_cdf(logprobs, split[:, 1]), split[:, 0], logprobs


def _inverse_cdf(logits: mx.array, keys: mx.array) -> mx.array:
    """``mx.random.categorical`` of each row with its key, as MLX draws a single row: the
    exclusive cumulative sum of exp(x - max) against a uniform times the total."""
    x = logits if logits.dtype == mx.float32 else logits.astype(mx.float32)
    m = mx.max(x, axis=-1, keepdims=True)
    w = mx.where(mx.isinf(m), (x == m).astype(x.dtype), mx.exp(x - m))
    cdf = mx.cumsum(w, axis=-1, inclusive=False)
    u = mx.vmap(lambda key: mx.random.uniform(shape=(1,), key=key))(keys)
    u = u * mx.sum(w, axis=-1, keepdims=True)
    return (mx.sum(cdf <= u, axis=-1) - 1).astype(mx.uint32)


def batched_draw(p: SamplingParams, vocab_size: int, shared: dict | None = None
                 ) -> BatchedDraw | None:
    """The draw of ``p``'s settings, one object per distinct settings in ``shared`` (the
    batch groups its rows by it; one dict per engine, as the bias row is an MLX array of the
    engine thread's stream), or None when its chain needs the sequence's own state or its draw
    is not ``dist``. The caller rules out grammars, reasoning budgets and recorded
    probabilities (processors outside the chain)."""
    if p.n_probs > 0 or p.mirostat or "adaptive_p" in p.samplers or "infill" in p.samplers:
        return None
    if p.temperature <= 0.0 and "temperature" in p.samplers:
        return None  # greedy: the shared greedy sampler already batches it
    if penalties_active(p) or dry_active(p) or _active(p, "xtc"):
        return None
    names = tuple(n for n in p.samplers if n in BATCHABLE and _active(p, n))
    settings = tuple(getattr(p, f) for f in FILTER_FIELDS)
    key = (names, settings, tuple(p.logit_bias), vocab_size)
    shared = {} if shared is None else shared
    if key not in shared:
        if len(shared) >= MAX_SHARED:  # live sequences keep theirs; new ones group afresh
            shared.clear()
        shared[key] = _new_draw(*key)
    return shared[key]


def _active(p: SamplingParams, name: str) -> bool:
    return make_filter(name, p, random.Random(0)) is not None


def _new_draw(names: tuple[str, ...], settings: tuple, bias: tuple,
              vocab_size: int) -> BatchedDraw:
    p = replace(SamplingParams(), **dict(zip(FILTER_FIELDS, settings)))
    steps: list[Filter] = []
    for name in names:
        if name == "top_p" and steps and getattr(steps[-1], "top_k", None):
            steps[-1] = top_k_top_p(steps[-1].top_k, p.top_p, p.min_keep)
        else:
            steps.append(make_filter(name, p, random.Random(0)))
            if name == "top_k" and p.top_k < vocab_size:
                steps[-1].top_k = p.top_k  # type: ignore[attr-defined]
    return BatchedDraw(tuple(steps), logit_bias_processor(list(bias), vocab_size) if bias else None)


def with_batched_draw(sampler: Callable, draw: BatchedDraw, rng: RngState) -> Callable:
    """Mark a sequence's sampler as drawable in its settings' batch (engine/batching.py)."""
    sampler.batched = (draw, rng)  # type: ignore[attr-defined]
    return sampler


def draw_of(sampler: Callable | None) -> tuple[BatchedDraw, RngState] | None:
    return getattr(sampler, "batched", None)


def draw_rows(draw: BatchedDraw, logits: mx.array, rngs: list[RngState]
              ) -> tuple[mx.array, mx.array]:
    """Tokens and normalized logits of ``logits``' rows; each row's key moves on as the
    sequence's own sampler would move it (lazily: no host synchronization)."""
    keys = mx.stack([rng["key"] for rng in rngs])
    tokens, next_keys, logprobs = draw(logits, keys)
    for i, rng in enumerate(rngs):
        rng["key"] = next_keys[i]
    return tokens, logprobs


# ---- top_k then top_p without sorting the vocabulary ------------------------------------------
def top_k_top_p(k: int, p: float, min_keep: int) -> Filter:
    """engine/sampling.py's top_k filter then its top_p filter, to the bit, sorting only the k
    best: after top_k the candidates are the values at or above the k-th largest (ties at it
    included), so top_p's sorted row is the k best sorted, then the k-th value repeated for the
    ties past k, then -inf, and a candidate's place in it is what MLX's stable argsort gives
    it (ties in vocabulary order)."""

    def apply(logits: mx.array) -> mx.array:
        v = logits.shape[-1]
        if k >= v:  # top_k keeps everything
            return top_p_filter(p, min_keep)(logits)
        at = v - k
        kth = mx.partition(logits, at, axis=-1)[..., at : at + 1]
        kept = logits >= kth
        top = mx.argpartition(-logits, k - 1, axis=-1)[..., :k]
        top_values = mx.take_along_axis(logits, top, axis=-1)
        positions = mx.arange(v)
        n_kept = mx.sum(kept, axis=-1, keepdims=True)
        best = mx.concatenate([-mx.sort(-top_values, axis=-1),
                               mx.full((*logits.shape[:-1], v - k), NEG_INF, logits.dtype)], -1)
        sorted_row = mx.where(positions < k, best,
                              mx.where(positions < n_kept, kth, NEG_INF)).astype(logits.dtype)
        probs = mx.softmax(sorted_row, axis=-1)
        before = mx.cumsum(probs, axis=-1) - probs
        keep_sorted = (before < p) | (positions < max(min_keep, 1))
        place = mx.take_along_axis(keep_sorted, _places(logits, kth, top, top_values), axis=-1)
        return mx.where(kept & place, logits, NEG_INF)

    return apply


def _places(logits: mx.array, kth: mx.array, top: mx.array, top_values: mx.array) -> mx.array:
    """Each candidate's position in the stable descending order: above the k-th value, the
    better ones and the equal ones of lower id among the k best (they all are there); at it,
    those above plus the tied ones of lower id in the vocabulary."""
    n_above = mx.sum(logits > kth, axis=-1, keepdims=True)
    tied = (logits == kth).astype(mx.int32)
    places = n_above + mx.cumsum(tied, axis=-1) - tied
    a, b = top_values[..., :, None], top_values[..., None, :]
    ahead = (b > a) | ((b == a) & (top[..., None, :] < top[..., :, None]))
    above_places = mx.sum(ahead, axis=-1).astype(places.dtype)
    return mx.put_along_axis(places, top, mx.where(top_values > kth, above_places,
                                                   mx.take_along_axis(places, top, axis=-1)),
                             axis=-1)
