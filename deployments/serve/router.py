"""Prefix-aware routing between model replicas: Ray Serve LLM's ``PrefixCacheAffinityRouter``
(``ray.serve.llm.request_router``), fed with the prompt's token ids instead of its text.

Its policy: when the replicas' queue lengths differ by at most ``imbalanced_threshold``, a request
goes to the replica whose routing history shares the longest prefix with its prompt (if at least
``match_rate_threshold`` of it matches; else to the replica holding the least); when they differ
by more, to the less loaded of two random replicas (power of two choices). The history is one
prefix tree per deployment, kept in a detached actor, so every shaper replica routes alike.

Configured per deployment (configs/autoscale.yaml)::

    request_router_config:
      request_router_class: deployments.serve.router:PrefixAffinityRouter
      request_router_kwargs: {imbalanced_threshold: 4}
"""

from __future__ import annotations

# The class itself, imported from where ray.serve.llm re-exports it from: the public module
# also imports Ray Data's cloud filesystems (pyarrow), which serving does not need.
from ray.llm._internal.serve.routing_policies.prefix_aware.prefix_aware_router import (
    PrefixCacheAffinityRouter,
)
from ray.serve._private.request_router.common import PendingRequest

UNICODE_LIMIT = 0x110000


def tokens_as_text(tokens: list[int]) -> str:
    """One character per token id, so that the router's character prefix tree matches token
    prefixes exactly (a text prefix would not: the replica's cache is keyed by tokens)."""
    return "".join(chr(t % UNICODE_LIMIT) for t in tokens)


class PrefixAffinityRouter(PrefixCacheAffinityRouter):
    """Routes ``ModelReplica.generate(requests)`` (and ``push``) by its first request's prompt
    tokens; calls without requests (``ready``, ``model_info``, ...) are routed by power of two
    choices."""

    def _extract_text_from_request(self, pending_request: PendingRequest) -> str | None:
        args = pending_request.args
        if not args or not isinstance(args[0], list) or not args[0]:
            return None
        tokens = getattr(args[0][0], "prompt_tokens", None)
        if not isinstance(tokens, list) or not tokens:
            return None
        return tokens_as_text(tokens)
