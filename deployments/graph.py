"""The graph builder: ingress -> response shaper -> model replica, from a config's ``args``.

``serve run configs/local.yaml`` calls ``build_app(args)``; Python callers do the same:
``serve.run(build_app({"model": "models/tiny-python"}))``.
"""

from __future__ import annotations

from typing import Any

from ray.serve import Application

from .config import GraphArgs
from .ingress import Ingress
from .replica import ModelReplica
from .shaper import ResponseShaper

# Calls other than generation (readiness, model info, slots) that must get through a full queue.
CONTROL_HEADROOM = 16

def build_app(args: dict[str, Any] | GraphArgs | None = None) -> Application:
    """The application builder ``import_path: deployments.graph:build_app`` names (Ray Serve
    requires it to take exactly one argument)."""
    config = args if isinstance(args, GraphArgs) else GraphArgs.model_validate(args or {})
    return build_graph(config)


def replica_ongoing_limit(config: GraphArgs) -> int:
    """Ray Serve's max_ongoing_requests for a replica: every slot busy plus a full engine queue,
    so that the engine's own bound (503 past ``max_queue``) is what a client meets, never a
    request parked in Ray Serve's router."""
    return config.n_parallel + config.max_queue + CONTROL_HEADROOM


def build_graph(config: GraphArgs, replica_options: dict[str, Any] | None = None) -> Application:
    """``replica_options`` are ModelReplica's deployment options (num_replicas,
    autoscaling_config, request_router_config, health_check_period_s, ...), as a config's
    ``deployments`` sets them; max_ongoing_requests defaults to ``replica_ongoing_limit``."""
    limit = replica_ongoing_limit(config)
    front = max(1000, 2 * limit)
    options = {"max_ongoing_requests": limit, **(replica_options or {})}
    replica = ModelReplica.options(**options).bind(config)
    shaper = ResponseShaper.options(max_ongoing_requests=front).bind(replica, config)
    return Ingress.options(max_ongoing_requests=front).bind(shaper, replica, config)
