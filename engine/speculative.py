"""Speculative decoding with n-gram drafts (llama.cpp's ``ngram-simple``, no draft model): each
greedy sequence in the generation batch proposes the tokens that followed the last time its
last ``size_n`` tokens appeared in its context, one forward pass of the target over the whole
batch verifies every draft, each sequence keeps its accepted prefix plus the target's next
token, and each row's KV cache drops its rejected tail (a per-row roll into left padding, the
way mlx-lm's ``BatchKVCache.finalize`` absorbs right padding).

A draft token is accepted when the target's own choice at its position equals it. Only
sequences whose whole chain is the argmax speculate (``argmax_only``: greedy, and the steps
before the draw only cut the tail, so they cannot move the top token); a batch holding any
other sequence (sampled, grammar, penalties, logit bias, n_probs, reasoning budget) steps as
without speculation, so every sequence's tokens and draws are unchanged."""

from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx
from mlx_lm.models.cache import BatchKVCache, dynamic_roll

from .penalties import dry_active, penalties_active
from .sampling import greedy
from .types import SamplingParams, SpecCounters


@dataclass
class SpecConfig:
    """``--spec-type ngram-simple`` and its sizes (llama.cpp's defaults)."""

    size_n: int = 12  # --spec-ngram-simple-size-n: the n-gram looked up in the context
    size_m: int = 48  # --spec-ngram-simple-size-m: the tokens after it that are proposed


def ngram_draft(tokens: list[int], sampled: int, size_n: int, size_m: int) -> list[int]:
    """llama.cpp's ``common_ngram_simple_draft``: the last ``size_n`` tokens (``sampled``, the
    token not yet in the context, last) looked up backwards in ``tokens``, position 0 aside;
    the tokens that followed the match (at most ``size_m``, at least ``size_n``), or none."""
    n = len(tokens)
    if n <= size_n + size_m + 1:
        return []
    pattern = [*tokens[n - size_n + 1:], sampled]
    for start in range(n - size_n - 1, 0, -1):
        if tokens[start] == pattern[0] and tokens[start:start + size_n] == pattern:
            copy = min(size_m, n - (start + size_n))
            return tokens[start + size_n:start + size_n + copy] if copy >= size_n else []
    return []


def argmax_only(p: SamplingParams, sampler, constrained: bool) -> bool:
    """The sequence's next token is the argmax of the model's logits: a greedy draw, no
    grammar or budget (``constrained``), and nothing before it that can move the top token."""
    return (sampler is greedy and not constrained and p.mirostat == 0 and not p.logit_bias
            and p.n_probs == 0 and not penalties_active(p) and not dry_active(p)
            and p.typical_p >= 1.0 and p.xtc_probability <= 0.0 and "infill" not in p.samplers)


def can_speculate(batch) -> bool:
    """Every row's chain is the argmax and every layer's cache the plain batch KV cache."""
    if not batch.uids or not all(uid in batch.argmax_uids for uid in batch.uids):
        return False
    return all(type(c) is BatchKVCache for c in batch.prompt_cache)


def drafts_of(batch, current: list[int], config: SpecConfig) -> list[list[int]]:
    """Each row's n-gram draft (maybe none)."""
    return [ngram_draft(tokens, token, config.size_n, config.size_m)
            for tokens, token in zip(batch.tokens, current)]


def accepted_length(draft: list[int], choices: list[int]) -> int:
    """How many leading draft tokens equal the target's choice at their position."""
    n = 0
    while n < len(draft) and draft[n] == choices[n]:
        n += 1
    return n


def drop_rejected(caches: list, rejected: list[int]) -> None:
    """Each row's cache loses its last ``rejected[row]`` entries: the same count for every row
    trims, different counts roll each row's tail into its left padding."""
    if max(rejected) == 0:
        return
    if min(rejected) == max(rejected):
        for c in caches:
            c.trim(rejected[0])
        return
    shift = mx.array(rejected)
    for c in caches:
        keys, values = c.keys[..., :c._idx, :], c.values[..., :c._idx, :]
        c.keys = dynamic_roll(keys, shift[:, None], axis=2)
        c.values = dynamic_roll(values, shift[:, None], axis=2)
        c.offset = c.offset - shift
        c.left_padding = c.left_padding + shift
        drop = min(c.left_padding.tolist())
        if drop > 0:
            c.keys, c.values = c.keys[..., drop:, :], c.values[..., drop:, :]
            c._idx -= drop
            c.left_padding = c.left_padding - drop


def verify_step(batch, current: list[int], drafts: list[list[int]], counters: SpecCounters,
                by_uid: dict[int, SpecCounters]) -> tuple[list[list[int]], list[list[mx.array]]]:
    """One forward pass over every row's current token and padded draft: each row's emitted
    tokens (current plus accepted draft) with their logprobs; the batch's next tokens set.
    The engine's counters and each row's own (``by_uid``) count the drafts."""
    width = max(len(d) for d in drafts)
    rows = [[t, *d, *[t] * (width - len(d))] for t, d in zip(current, drafts)]
    logits = batch.model(mx.array(rows), cache=batch.prompt_cache)
    logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
    choices = mx.argmax(logprobs, axis=-1).tolist()
    emitted, emitted_logprobs, next_tokens, next_logprobs, rejected = [], [], [], [], []
    for e, draft in enumerate(drafts):
        n = accepted_length(draft, choices[e])
        if draft:
            counters.add(len(draft), n)
            if batch.uids[e] in by_uid:
                by_uid[batch.uids[e]].add(len(draft), n)
        token = choices[e][n]
        emitted.append([current[e], *draft[:n]])
        emitted_logprobs.append([batch._current_logprobs[e], *(logprobs[e, i] for i in range(n))])
        next_tokens.append(token)
        next_logprobs.append(logprobs[e, n])
        rejected.append(width - n)
    drop_rejected(batch.prompt_cache, rejected)
    batch._next_tokens = mx.array(next_tokens, dtype=mx.uint32)
    batch._next_logprobs = next_logprobs
    for tokens, row in zip(batch.tokens, emitted):
        tokens.extend(row)
    return emitted, emitted_logprobs
