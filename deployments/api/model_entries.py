"""The entries of ``GET /models``: a model's own (as its llama-server answers) and, in router
mode, the router's (tools/server/server-models.cpp get_router_models)."""

from __future__ import annotations

from typing import Any

from deployments.api.config import GraphArgs
from deployments.api.router_models import ModelState

ARCHITECTURE = {"input_modalities": ["text"], "output_modalities": ["text"]}


def oai_entry(args: GraphArgs, info: dict, created: int, name: str) -> dict:
    """A model's entry, or one of its adapters' (the model's figures, no aliases)."""
    return {
        "id": name,
        "aliases": sorted({args.alias, *args.aliases}) if args.alias and name == args.model_name
        else [],
        "tags": sorted(args.tags) if name == args.model_name else [],
        "object": "model",
        "created": created,
        "owned_by": "llamacpp",
        "meta": {
            "vocab_type": True,  # b10621 writes the vocabulary type as a boolean
            "n_vocab": info["n_vocab"],
            "n_ctx": args.n_ctx,
            "n_ctx_train": info["n_ctx_train"],
            "n_embd": info["n_embd"],
            "n_params": info["n_params"],
            "size": info["size"],
            "ftype": info["ftype"],
        },
    }


def router_entry(args: GraphArgs, state: ModelState, created: int) -> dict[str, Any]:
    """A folder model's entry: its status, and while it runs its own entry's other keys."""
    entry: dict[str, Any] = {
        "id": state.name,
        "aliases": sorted({*args.aliases, *([args.alias] if args.alias else [])} - {state.name}),
        "tags": sorted(args.tags),
        "object": "model",
        "owned_by": "llamacpp",
        "created": created,
        "status": state.status_json(),
        "architecture": ARCHITECTURE,
        "source": args.model_source,
        "can_remove": False,
    }
    if state.running and state.info:
        entry |= {k: v for k, v in state.info.items() if k not in entry}
    return entry
