"""The engines a model replica can run (engine/seam.py's EngineLike), each made from the graph's
settings by an ``EngineMaker``: ``ModelReplica`` is given one as Ray Serve LLM's ``LLMServer``
is given ``engine_cls`` (``build_graph(config, engine=fake)``). Each imports what it runs when
it runs: a replica on the fake engine never imports MLX."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import fields

from deployments.api.config import GraphArgs
from engine.seam import EngineLike
from engine.types import EngineConfig

EngineMaker = Callable[[GraphArgs], EngineLike]


def engine_config(args: GraphArgs) -> EngineConfig:
    """The engine's settings, each the graph's setting of the same name."""
    names = [f.name for f in fields(EngineConfig) if f.name in GraphArgs.model_fields]
    return EngineConfig(**{name: getattr(args, name) for name in names})


def mlx_engine(args: GraphArgs) -> EngineLike:
    """The model on MLX (engine/scheduler.py), loaded here."""
    from engine.model import load_model
    from engine.scheduler import Engine

    loaded = load_model(args.model_path, args.adapter, args.device, args.config_overrides)
    draft = load_model(args.draft_path, device=args.device) if args.model_draft else None
    return Engine(loaded, engine_config(args), draft)


def fake(args: GraphArgs) -> EngineLike:
    """engine/fake.py's deterministic tokens on the model's tokenizer: no weights are read."""
    from engine.fake import fake_engine

    return fake_engine(args.model_path, engine_config(args))
