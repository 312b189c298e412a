"""What the reference refuses before a request runs, checked without MLX: the ingress refuses it
before anything is queued, the engine again when it admits it."""

from __future__ import annotations

from .types import EngineError


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
