"""A draft model's proposals (llama.cpp's ``draft-simple``, ``-md`` with ``--spec-type
draft-simple``): each speculating sequence keeps its own cache of the draft model, read up to
the sequence's context when it next drafts (its prompt the first time, the tokens the target
kept since then after), then the draft decodes up to ``n_max`` tokens, each the top one of its
10 best (llama.cpp's draft sampler: top_k 10), stopping early at one whose probability among
those 10 is under ``p_min``; a draft shorter than ``n_min`` is not proposed. After the target
verified the drafts (engine/speculative.py), each cache drops what the target rejected."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import mlx.core as mx
from mlx_lm.models.cache import can_trim_prompt_cache, make_prompt_cache, trim_prompt_cache

READ_CHUNK = 512  # context tokens the draft reads in one call when it catches up
TOP_K = 10


@dataclass(frozen=True)
class DraftSettings:
    """``--spec-draft-n-max``, ``--spec-draft-n-min`` and ``--spec-draft-p-min`` (llama.cpp's
    defaults)."""

    n_max: int = 3
    n_min: int = 0
    p_min: float = 0.0


class DraftRefused(ValueError):
    """A draft model the target cannot speculate with."""


def check_pair(target_vocab: Any, draft_vocab: Any, draft_model: Any) -> None:
    """llama.cpp's ``common_speculative_are_compatible``, in the terms mlx-lm gives: the same
    token pieces and end-of-generation ids; and a draft cache that can drop a rejected tail."""
    if (target_vocab.pieces != draft_vocab.pieces
            or set(target_vocab.eog_ids) != set(draft_vocab.eog_ids)):
        raise DraftRefused("draft model vocab type must match target model to use speculation")
    if not can_trim_prompt_cache(make_prompt_cache(draft_model)):
        raise DraftRefused("the draft model's cache cannot drop rejected tokens (a sliding "
                           "window or a recurrent layer): choose a draft with full attention")


class ModelDrafts:
    """The drafter of ``--model-draft``: one draft-model cache per speculating sequence."""

    def __init__(self, model: Any, n_vocab: int, settings: DraftSettings):
        self.model = model
        self.n_vocab = n_vocab
        self.settings = settings
        self.caches: dict[int, list] = {}

    @property
    def ceiling(self) -> int:
        return self.settings.n_max

    def drafts(self, batch, current: list[int], caps: list[int]) -> list[list[int]]:
        """Each row's draft of at most its cap; the caches of sequences that left the batch
        are dropped."""
        for uid in set(self.caches) - set(batch.uids):
            del self.caches[uid]
        return [self._draft(uid, [*tokens, token], cap)
                for uid, tokens, token, cap in zip(batch.uids, batch.tokens, current, caps)]

    def verified(self, batch) -> None:
        """Each cache keeps at most what the target kept of the sequence."""
        for uid, tokens in zip(batch.uids, batch.tokens):
            cache = self.caches.get(uid)
            if cache is not None and cache[0].offset > len(tokens):
                trim_prompt_cache(cache, cache[0].offset - len(tokens))

    def _draft(self, uid: int, context: list[int], cap: int) -> list[int]:
        cache = self.caches.get(uid)
        if cache is None:
            cache = self.caches[uid] = make_prompt_cache(self.model)
        logits = self._read(cache, context[cache[0].offset:])
        s, draft = self.settings, []
        n_max = min(s.n_max, max(cap, s.n_min))  # a cap under n_min would never draft
        while len(draft) < n_max:
            token, p = top_choice(logits)
            if p < s.p_min or token >= self.n_vocab:
                break
            draft.append(token)
            if len(draft) < n_max:
                logits = self._read(cache, [token])
        return draft if len(draft) >= s.n_min else []

    def _read(self, cache: list, tokens: list[int]) -> mx.array:
        """The draft's logits after ``tokens``, which its cache takes in."""
        for start in range(0, len(tokens), READ_CHUNK):
            logits = self.model(mx.array([tokens[start:start + READ_CHUNK]]), cache=cache)
            mx.eval(logits)
        return logits[0, -1]


def top_choice(logits: mx.array) -> tuple[int, float]:
    """The top token and its probability among the ``TOP_K`` best."""
    best = mx.topk(logits.astype(mx.float32), min(TOP_K, logits.shape[-1]))
    top = mx.max(best)
    p = mx.exp(top - mx.logsumexp(best))
    return int(mx.argmax(logits).item()), float(p.item())
