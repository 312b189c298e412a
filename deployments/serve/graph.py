"""The graph builder: ingress -> response shaper -> model replica, from a config's ``args``.

``serve run configs/local.yaml`` calls ``build_app(args)``; Python callers do the same:
``serve.run(build_app({"model": "models/tiny-python"}))``. An application of several models
(``args.models``, configs/multi-model.yaml) gets one shaper and one replica deployment per model,
named ``ResponseShaper:<model>`` and ``ModelReplica:<model>``, behind one ingress.
"""

from __future__ import annotations

from typing import Any

from ray.serve import Application

from deployments.api.config import GraphArgs, replica_ongoing_limit
from deployments.api.deployment_names import replica_deployment
from deployments.serve.engines import EngineMaker
from deployments.serve.ingress import Ingress
from deployments.serve.replica import ModelReplica
from deployments.serve.router import PINNED_ROUTER
from deployments.serve.shaper import ResponseShaper
from deployments.serve.status import StatusBoard


def build_app(args: dict[str, Any] | GraphArgs | None = None) -> Application:
    """The application builder ``import_path: deployments.serve.graph:build_app`` names (Ray Serve
    requires it to take exactly one argument)."""
    config = args if isinstance(args, GraphArgs) else GraphArgs.model_validate(args or {})
    return build_graph(config)


def front_ongoing_limit(config: GraphArgs) -> int:
    return max(1000, 2 * replica_ongoing_limit(config))


def deployment_suffix(model_name: str) -> str:
    """``:<model>``, the suffix of a model's deployments in an application of several models."""
    return replica_deployment(model_name, named=True).removeprefix("ModelReplica")


def build_graph(config: GraphArgs, replica_options: dict[str, Any] | None = None,
                engine: EngineMaker | None = None) -> Application:
    """``replica_options`` are ModelReplica's deployment options (num_replicas,
    autoscaling_config, request_router_config, health_check_period_s, ...), as a config's
    ``deployments`` sets them, for every model's replicas; max_ongoing_requests defaults to
    ``replica_ongoing_limit``. ``engine`` makes each replica's engine (deployments/serve/
    engines.py: the MLX one by default, ``engines.fake`` for the tests of the graph)."""
    models = config.model_configs()
    named = len(models) > 1
    suffixes = [deployment_suffix(m.model_name) if named else "" for m in models]
    for suffix in set(suffixes):
        same = [m.model_name for m, s in zip(models, suffixes) if s == suffix]
        if len(same) > 1:
            raise ValueError(f"models {same} would share the deployment names *{suffix}: "
                             "give them aliases that differ in more than '.', '/' or '#'")
    stacks = [model_stack(m, replica_options, s, engine) for m, s in zip(models, suffixes)]
    # the one ingress carries every model's requests
    front = max(1000, 2 * sum(replica_ongoing_limit(m) for m in models))
    return Ingress.options(max_ongoing_requests=front).bind(stacks, config, StatusBoard.bind())


def model_stack(config: GraphArgs, replica_options: dict[str, Any] | None, suffix: str,
                engine: EngineMaker | None = None) -> tuple[Application, Application, GraphArgs]:
    """One model's shaper and replica deployments, and its settings, as the ingress takes them."""
    # the pinning router unless the options name one: /metrics and /slots ask replica by replica
    options = {"max_ongoing_requests": replica_ongoing_limit(config),
               "request_router_config": PINNED_ROUTER, **(replica_options or {})}
    replica = ModelReplica.options(name="ModelReplica" + suffix, **options).bind(config, engine)
    shaper = ResponseShaper.options(name="ResponseShaper" + suffix,
                                    max_ongoing_requests=front_ongoing_limit(config))
    return shaper.bind(replica, config), replica, config
