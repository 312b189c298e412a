"""Embeddings from the model's last hidden states (after the final norm), pooled as llama.cpp
pools them (``--pooling``): none (one vector per token), mean, cls (the first token) or last.
Runs on the scheduler thread (``Engine.run_on_loop``), between decode steps."""

from __future__ import annotations

import mlx.core as mx

from .scheduler import Engine
from .types import EngineError


def hidden_states(engine: Engine, tokens: list[int]) -> mx.array:
    """(n_tokens, n_embd) hidden states of one prompt, causal attention, no KV cache."""
    body = getattr(engine.loaded.model, "model", None)
    if body is None:
        raise EngineError("this model does not expose its hidden states", 501,
                          "not_supported_error")
    return body(mx.array([tokens]))[0].astype(mx.float32)


def embed(engine: Engine, prompts: list[list[int]], pooling: str) -> list[list[list[float]]]:
    """Per prompt: one pooled vector, or one vector per token with pooling none (not normalized
    here: the caller normalizes pooled vectors, as the reference does)."""
    out = []
    for tokens in prompts:
        h = hidden_states(engine, tokens)
        if pooling == "mean":
            h = mx.mean(h, axis=0, keepdims=True)
        elif pooling == "cls":
            h = h[:1]
        elif pooling == "last":
            h = h[-1:]
        out.append(h.tolist())
    return out
