"""Routing between model replicas: a call can be pinned to one replica, and generation can be
routed by prompt prefix.

``PinnedRouter`` is Ray Serve's power of two choices, except for a call that names a replica
(``handle.ask.remote(..., replica=<unique id>)``, ``deployments/serve/replicas.py``), which goes
to that replica: /metrics, /slots and the slot actions address every replica of a model one by
one. A pinned replica that is gone is not waited for: any replica answers, and says who it is.
It is the replicas' router unless a config names another; ``PrefixAffinityRouter`` pins alike.

``PrefixAffinityRouter`` is Ray Serve LLM's ``PrefixCacheAffinityRouter``
(``ray.serve.llm.request_router``), fed with the prompt's token ids instead of its text. Its
policy: when the replicas' queue lengths differ by at most ``imbalanced_threshold``, a request
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
from ray.serve._private.request_router.pow_2_router import PowerOfTwoChoicesRequestRouter
from ray.serve._private.request_router.replica_wrapper import RunningReplica

UNICODE_LIMIT = 0x110000
PINNED_ROUTER = {"request_router_class": "deployments.serve.router:PinnedRouter"}


def tokens_as_text(tokens: list[int]) -> str:
    """One character per token id, so that the router's character prefix tree matches token
    prefixes exactly (a text prefix would not: the replica's cache is keyed by tokens)."""
    return "".join(chr(t % UNICODE_LIMIT) for t in tokens)


def pinned_replica(pending_request: PendingRequest | None) -> str | None:
    """The replica a call names: its ``replica`` keyword, or its requests' ``replica`` (a
    generation whose ``id_slot`` lives on one replica)."""
    if pending_request is None:
        return None
    named = pending_request.kwargs.get("replica")
    if isinstance(named, str):
        return named
    args = pending_request.args
    if args and isinstance(args[0], list) and args[0]:
        named = getattr(args[0][0], "replica", None)
    return named if isinstance(named, str) else None


class ReplicaPinning:
    """A mixin before a Ray Serve request router: calls that name a replica go to it."""

    async def choose_replicas(self, candidate_replicas: list[RunningReplica],
                              pending_request: PendingRequest | None = None,
                              ) -> list[list[RunningReplica]]:
        target = pinned_replica(pending_request)
        if target is not None:
            chosen = [r for r in candidate_replicas if r.replica_id.unique_id == target]
            if chosen:
                # a replica that does not take the call now is retried after a backoff (the
                # locality steps this skips would set it): without it, Serve retries at once
                pending_request.routing_context.should_backoff = True
                return [chosen]
        return await super().choose_replicas(candidate_replicas, pending_request)


class PinnedRouter(ReplicaPinning, PowerOfTwoChoicesRequestRouter):
    """Power of two choices, pinned calls to their replica. Ray Serve's FIFO order may hand a
    chosen replica to an older pending call than the one it was chosen for: calls pinned at
    once to each replica still reach each replica once, and every answer names its replica (a
    slot action that reaches another replica is refused there)."""


class PrefixAffinityRouter(ReplicaPinning, PrefixCacheAffinityRouter):
    """Routes ``ModelReplica.generate(requests)`` (and ``push``) by its first request's prompt
    tokens; calls without requests (``ready``, ``model_info``, ...) are routed by power of two
    choices, pinned calls to their replica."""

    def _extract_text_from_request(self, pending_request: PendingRequest) -> str | None:
        args = pending_request.args
        if not args or not isinstance(args[0], list) or not args[0]:
            return None
        tokens = getattr(args[0][0], "prompt_tokens", None)
        if not isinstance(tokens, list) or not tokens:
            return None
        return tokens_as_text(tokens)
