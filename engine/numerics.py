"""Logit arithmetic that stays finite at the edges of a request's numbers (the sampler
initialization checks of llama.cpp's ``common_sampler_init`` are engine/checks.py's).

A request may ask for a penalty of 3e38, a temperature of 1e-38 or of infinity, a DRY multiplier
of -inf. The sampler chain then meets infinite logits, and ``inf - inf`` or ``-inf / inf`` is
NaN: softmax, the draw and the reported probabilities turn to garbage (llama.cpp's own chain is
undefined there). Here no step produces a NaN:

- a processor's result is capped at the largest float32 (``cap``): a logit pushed to +inf is
  "certain" and stays comparable, one pushed to -inf is banned;
- a logit already at -inf stays there whatever is subtracted from it (``subtract``);
- a temperature divides the logits as llama.cpp's does (``scale``), but where that would
  overflow it scales them shifted so that the best is 0: a zero temperature keeps the best, an
  infinite one makes every remaining candidate equal, a tiny one cannot overflow.
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np

FLT_MAX = float(np.finfo(np.float32).max)
NEG_INF = float("-inf")


def cap(logits: mx.array) -> mx.array:
    """+inf becomes the largest finite float32 (the token is as likely as logits can say)."""
    return mx.minimum(logits, FLT_MAX)


def subtract(logits: mx.array, penalty: mx.array) -> mx.array:
    """``logits - penalty`` where a banned (-inf) logit stays banned, capped."""
    return cap(mx.where(logits == NEG_INF, NEG_INF, logits - penalty))


def scale(logits: mx.array, temperature: mx.array | float) -> mx.array:
    """``logits / temperature`` exactly, as llama.cpp's temperature sampler divides (a later
    repeat penalty reads the sign of what it gets); banned ones stay -inf. Where a row's quotient
    would not be finite (a zero or tiny temperature), that row is shifted first so that the best
    candidates get 0 and the rest ``(logit - best) / temperature``: -inf for a zero temperature,
    never a NaN."""
    banned = logits == NEG_INF
    plain = logits / temperature
    finite = mx.all(banned | (mx.abs(plain) <= FLT_MAX), axis=-1, keepdims=True)
    top = mx.max(logits, axis=-1, keepdims=True)
    shifted = mx.where(logits >= top, 0.0, (logits - top) / temperature)
    return mx.where(banned, NEG_INF, mx.where(finite, plain, shifted))
