"""llama.cpp's sampler chain before the draw, in the order of ``samplers``, as one logits processor.

llama.cpp applies its samplers one after the other to the raw logits (after the logit bias and the
grammar): penalties and DRY, which read the tokens so far, in whatever position ``samplers`` puts
them, like the others. mlx-lm hands a logits processor the context and the raw logits, and
normalizes them before the sampler, so the chain runs here as the last processor (after the
grammar's) and the sampler only draws (engine/sampling.py's ``make_sampler``).
"""

from __future__ import annotations

import bisect
import random
from collections.abc import Callable
from dataclasses import dataclass, replace

import mlx.core as mx
import numpy as np

from .penalties import (
    Breakers,
    dry_active,
    dry_processor,
    penalties_active,
    penalties_processor,
)
from .sampling import NEG_INF, LogitsProcessor, make_filter
from .types import SamplingParams

# samplers that can take the most likely candidate away: before a zero temperature they still act
ARGMAX_MOVING = ("penalties", "dry", "typ_p", "xtc", "infill")
INFILL_THRESHOLD = 0.2


@dataclass(frozen=True)
class InfillVocab:
    """What the infill sampler reads of the vocabulary: pieces (special tokens empty, as
    token_to_piece without special), the end-of-generation ids, the token it falls back to."""

    pieces: list[bytes]
    eog: frozenset[int]
    eot: int


def infill_vocab(vocab) -> InfillVocab | None:
    """The end-of-text token is the tokenizer's EOS (mlx-lm tokenizers name no separate EOT)."""
    if not vocab.eog_ids:
        return None
    eos = getattr(vocab.hf, "eos_token_id", None)
    return InfillVocab(vocab.pieces, frozenset(vocab.eog_ids),
                       eos if eos in vocab.eog_ids else min(vocab.eog_ids))


def chain_processor(p: SamplingParams, seed: int, breakers: Breakers | None,
                    infill: InfillVocab | None) -> LogitsProcessor | None:
    """The steps of ``p.samplers`` that change anything, or None. Mirostat replaces the chain
    (its temperature is the sampler's); at a zero temperature the draw is greedy, so only the
    steps before it up to the last that can move the top candidate matter: those that only cut
    the tail (top_k, top_p, min_p, ...) still shape what such a step sees (XTC keeps the least
    likely of the candidates left), and after it they change nothing."""
    if p.mirostat:
        return None
    if p.temperature <= 0.0 and "temperature" in p.samplers:
        before = p.samplers[: p.samplers.index("temperature")]
        moving = [i for i, name in enumerate(before) if name in ARGMAX_MOVING]
        p = replace(p, samplers=before[: moving[-1] + 1] if moving else [])
    steps = make_steps(p, random.Random(seed), breakers, infill)
    if not steps:
        return None

    def apply(tokens: mx.array, logits: mx.array) -> mx.array:
        for step in steps:
            logits = step(tokens, logits)
        return logits

    return apply


def make_steps(p: SamplingParams, rng: random.Random, breakers: Breakers | None,
               infill: InfillVocab | None) -> list[LogitsProcessor]:
    steps: list[LogitsProcessor] = []
    for name in p.samplers:
        if name == "penalties":
            if penalties_active(p):
                steps.append(penalties_processor(p))
        elif name == "dry":
            if dry_active(p):
                steps.append(dry_processor(p, breakers or {}))
        elif name == "infill":
            if infill is not None:
                steps.append(infill_step(infill))
        elif (f := make_filter(name, p, rng)) is not None:
            steps.append(_on_logits(f))
    return steps


def _on_logits(f: Callable[[mx.array], mx.array]) -> LogitsProcessor:
    return lambda tokens, logits: f(logits)


# ---- infill (llama.cpp's llama_sampler_infill) ---------------------------------------------------
def infill_step(vocab: InfillVocab) -> LogitsProcessor:
    """On the host: it compares token pieces."""

    def apply(tokens: mx.array, logits: mx.array) -> mx.array:
        row = np.array(logits[0].astype(mx.float32))
        return mx.array(infill_keep(row, vocab))[None].astype(logits.dtype)

    return apply


def infill_keep(row: np.ndarray, vocab: InfillVocab) -> np.ndarray:
    """The logits the infill sampler leaves: only the end-of-generation tokens when their mass
    is large against the text's (3 x p_eog x candidates > p_text); else each token whose piece
    starts another's is merged into the likelier of the two, text tokens under 0.2 (then under
    1 / (text tokens + 1)) are dropped, and with no text token left, the end of text alone."""
    ids = np.flatnonzero(row > NEG_INF)
    if ids.size == 0:
        return row
    ids = ids[np.argsort(-row[ids], kind="stable")]
    probs = np.exp(row[ids] - row[ids[0]]).astype(np.float32)
    probs /= probs.sum()
    eog = np.isin(ids, list(vocab.eog))
    out = np.full_like(row, NEG_INF)
    if 3 * probs[eog].sum() * ids.size > probs[~eog].sum():
        out[ids[eog]] = row[ids[eog]]
        return out
    alive = _merge_prefixes([vocab.pieces[i] for i in ids], probs)
    kept = alive & ((probs >= INFILL_THRESHOLD) | eog)
    n_text = int((kept & ~eog).sum())
    if n_text == 0:
        out[vocab.eot] = 1.0
        return out
    share = probs / probs[kept].sum()
    kept &= (share >= 1.0 / (n_text + 1)) | eog
    out[ids[kept]] = row[ids[kept]]
    return out


def _merge_prefixes(pieces: list[bytes], probs: np.ndarray) -> np.ndarray:
    """For each candidate in order, each later-listed or earlier one whose piece starts with its
    piece (in candidate order) gives its probability to the likelier of the two, which stays;
    the other is gone. Only prefix pairs do anything, so only they are visited."""
    alive = np.ones(len(pieces), dtype=bool)
    by_piece = sorted(range(len(pieces)), key=pieces.__getitem__)
    sorted_pieces = [pieces[i] for i in by_piece]
    for a, piece in enumerate(pieces):
        if not piece:
            continue
        start = bisect.bisect_left(sorted_pieces, piece)
        longer = []
        for k in range(start, len(sorted_pieces)):
            if not sorted_pieces[k].startswith(piece):
                break
            if by_piece[k] != a:
                longer.append(by_piece[k])
        for b in sorted(longer):
            if not alive[a]:
                break
            if not alive[b]:
                continue
            dst, src = (b, a) if probs[b] > probs[a] else (a, b)
            probs[dst] += probs[src]
            probs[src] = 0.0
            alive[src] = False
    return alive
