"""Embeddings from the model's last hidden states (after the final norm), pooled as llama.cpp
pools them (``--pooling``): none (one vector per token), mean, cls (the first token) or last.
Runs on the scheduler thread (``Engine.run_on_loop``), between decode steps."""

from __future__ import annotations

import math

import mlx.core as mx

from .scheduler import Engine
from .types import EngineError

POOLINGS = ("none", "mean", "cls", "last")


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


def normalize(vector: list[float], norm: int) -> list[float]:
    """common_embd_normalize: -1 none, 0 max-abs scaled to int16, 1 taxicab, 2 euclidean,
    above 2 the p-norm."""
    if norm == -1:
        total = 1.0
    elif norm == 0:
        total = max((abs(v) for v in vector), default=0.0) / 32760.0
    elif norm == 2:
        total = math.sqrt(sum(v * v for v in vector))
    else:
        total = sum(abs(v) ** norm for v in vector) ** (1.0 / norm)
    scale = 1.0 / total if total > 0.0 else 0.0
    return [v * scale for v in vector]
