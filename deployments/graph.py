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


def build_app(args: dict[str, Any] | GraphArgs | None = None) -> Application:
    """The application builder ``import_path: deployments.graph:build_app`` names (Ray Serve
    requires it to take exactly one argument)."""
    config = args if isinstance(args, GraphArgs) else GraphArgs.model_validate(args or {})
    return build_graph(config)


def build_graph(config: GraphArgs, replica_options: dict[str, Any] | None = None) -> Application:
    """``replica_options`` are ModelReplica's deployment options (num_replicas,
    autoscaling_config, request_router_config, ...), as a config's ``deployments`` sets them."""
    replica = ModelReplica.options(**(replica_options or {})).bind(config)
    shaper = ResponseShaper.bind(replica, config)
    return Ingress.bind(shaper, replica, config)
