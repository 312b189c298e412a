"""What the reference refuses before a request runs, checked without MLX: the ingress refuses it
before anything is queued, the engine again when it admits it."""

from __future__ import annotations

import math

import numpy as np

from .types import EngineError, SamplingParams


def check_prompt(tokens: list[int], n_vocab: int, n_ctx: int) -> None:
    """Refuse what the reference refuses at slot launch: unknown ids, a prompt filling the slot."""
    if not all(0 <= t < n_vocab for t in tokens):
        raise EngineError("Prompt contains invalid tokens")
    n = len(tokens)
    if n >= n_ctx:
        raise EngineError(
            f"request ({n} tokens) exceeds the available context size ({n_ctx} tokens), "
            "try increasing it",
            type="exceed_context_size_error",
            n_prompt_tokens=n,
            n_ctx=n_ctx,
        )


def check_queue_room(n_new: int, n_waiting: int, room: int) -> None:
    """Refuse a request whose ``n_new`` sequences (its prompts times n_cmpl) do not all fit in
    ``room`` (the free slots plus the queue's bound) beside the ``n_waiting`` already queued: the
    whole request, before any of it is queued, so a request of many prompts never fills the queue
    for the clients after it. The reference queues without bound."""
    if n_waiting + n_new > room:
        raise EngineError("the server is busy: too many queued requests", 503,
                          "unavailable_error")


def _f32(value: float) -> np.float32:
    with np.errstate(over="ignore"):
        return np.float32(value)


def sampler_init_error(p: SamplingParams) -> str | None:
    """common_sampler_init's refusals (common/sampling.cpp), in its order, in float32."""
    repeat = _f32(p.repeat_penalty)
    with np.errstate(divide="ignore", over="ignore"):
        reciprocal = np.float32(1.0) / repeat if repeat != 0 else np.float32(np.inf)
    if not math.isfinite(repeat) or repeat <= 0 or not math.isfinite(reciprocal):
        return "penalty_repeat must be finite and greater than 0"
    if not math.isfinite(_f32(p.frequency_penalty)):
        return "penalty_freq must be finite"
    if not math.isfinite(_f32(p.presence_penalty)):
        return "penalty_present must be finite"
    return None
