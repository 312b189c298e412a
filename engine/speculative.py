"""Speculative decoding in the generation batch: each sequence proposes a draft (llama.cpp's
``ngram-simple``: the tokens that followed the last time its last ``size_n`` tokens appeared in
its context; ``draft-simple``: a draft model's, engine/draft_model.py), one forward pass of the
target over the whole batch verifies every draft, each sequence keeps its accepted prefix plus
the target's next token, and each row's KV cache drops its rejected tail (a per-row roll into
left padding, the way mlx-lm's ``BatchKVCache.finalize`` absorbs right padding).

A draft token is accepted when the target's own choice at its position equals it, as llama.cpp's
``common_sampler_sample_and_accept_n`` accepts: the target's choice there is the argmax for a
greedy sequence (``argmax_only``: the steps before the draw only cut the tail, so they cannot
move the top token), and for a sampled one whose chain is a batched draw (engine/batched_chain.py)
the draw of its whole chain with the key it would use there, its keys chained as its own
sampler chains them and moved on once per token it keeps. So every token is the one decoding
without speculation gives, seeded draws included, and each follows the target's distribution
after the chain. A batch holding any other sequence (grammar, penalties, DRY, XTC, n_probs,
mirostat, reasoning budget) steps as without speculation."""

from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx
from mlx_lm.models.cache import BatchKVCache, dynamic_roll

from .batched_chain import draw_of
from .penalties import dry_active, penalties_active
from .sampling import greedy
from .types import SamplingParams, SpecCounters


@dataclass
class NgramDrafts:
    """``--spec-type ngram-simple`` and its sizes (llama.cpp's defaults)."""

    size_n: int = 12  # --spec-ngram-simple-size-n: the n-gram looked up in the context
    size_m: int = 48  # --spec-ngram-simple-size-m: the tokens after it that are proposed

    @property
    def ceiling(self) -> int:
        return self.size_m

    def drafts(self, batch, current: list[int], caps: list[int]) -> list[list[int]]:
        """Each row's n-gram draft (maybe none), cut to its cap."""
        return [ngram_draft(tokens, token, self.size_n, self.size_m)[:cap]
                for tokens, token, cap in zip(batch.tokens, current, caps)]

    def verified(self, batch) -> None:
        """Nothing to keep in step: the drafts are read from the context itself."""


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


def speculates(p: SamplingParams, sampler, constrained: bool) -> bool:
    """The sequence's choice at a draft position can be made for every position at once: the
    argmax, or its chain's batched draw."""
    return argmax_only(p, sampler, constrained) or (not constrained and draw_of(sampler)
                                                    is not None)


def can_speculate(batch) -> bool:
    """Every row may speculate and every layer's cache is the plain batch KV cache."""
    if not batch.uids or not all(uid in batch.spec_uids for uid in batch.uids):
        return False
    return all(type(c) is BatchKVCache for c in batch.prompt_cache)


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


def key_chain(key: mx.array, n: int) -> mx.array:
    """The ``n`` keys a sampler starting at ``key`` draws its next ``n`` tokens with, each the
    first half of the split of the one before (the split ``BatchedDraw`` makes per draw)."""
    keys = [key]
    for _ in range(n - 1):
        keys.append(mx.random.split(keys[-1])[0])
    return mx.stack(keys)


def target_choices(batch, logits: mx.array) -> tuple[list[list[int]], mx.array, dict]:
    """Each row's choice at each position (the argmax, or its draw's token with the key of that
    position), the normalized logits they were chosen from, and the drawn rows' keys after each
    position, for ``commit_keys``."""
    logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
    choices = mx.argmax(logprobs, axis=-1)
    drawn = {}
    for e, sampler in enumerate(batch.samplers):
        found = draw_of(sampler)
        if found is None:
            continue
        draw, rng = found
        tokens, next_keys, drawn_logprobs = draw(logits[e], key_chain(rng["key"], logits.shape[1]))
        drawn[e] = (rng, next_keys)
        choices[e] = tokens.astype(choices.dtype)
        logprobs[e] = drawn_logprobs.astype(logprobs.dtype)
    return choices.tolist(), logprobs, drawn


def verify_step(batch, current: list[int], drafts: list[list[int]], counters: SpecCounters,
                by_uid: dict[int, SpecCounters]) -> tuple[list[list[int]], list[list[mx.array]]]:
    """One forward pass over every row's current token and padded draft: each row's emitted
    tokens (current plus accepted draft) with their logprobs; the batch's next tokens set.
    The engine's counters and each row's own (``by_uid``) count the drafts."""
    width = max(len(d) for d in drafts)
    rows = [[t, *d, *[t] * (width - len(d))] for t, d in zip(current, drafts)]
    logits = batch.model(mx.array(rows), cache=batch.prompt_cache)
    choices, logprobs, drawn = target_choices(batch, logits)
    emitted, emitted_logprobs, next_tokens, next_logprobs, rejected = [], [], [], [], []
    for e, draft in enumerate(drafts):
        n = accepted_length(draft, choices[e])
        if draft:
            counters.add(len(draft), n)
            if batch.uids[e] in by_uid:
                by_uid[batch.uids[e]].add(len(draft), n)
        if e in drawn:  # the row drew n + 1 tokens: its key moves on as many times
            rng, next_keys = drawn[e]
            rng["key"] = next_keys[n]
        emitted.append([current[e], *draft[:n]])
        emitted_logprobs.append([batch._current_logprobs[e], *(logprobs[e, i] for i in range(n))])
        next_tokens.append(choices[e][n])
        next_logprobs.append(logprobs[e, n])
        rejected.append(width - n)
    drop_rejected(batch.prompt_cache, rejected)
    batch._next_tokens = mx.array(next_tokens, dtype=mx.uint32)
    batch._next_logprobs = next_logprobs
    for tokens, row in zip(batch.tokens, emitted):
        tokens.extend(row)
    return emitted, emitted_logprobs
