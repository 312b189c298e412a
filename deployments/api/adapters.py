"""The ingress's table of one model's LoRA adapters (no MLX here: the replica's side is
deployments/serve/replica_adapters.py): llama-server's ids, paths and global scales
(GET and POST /lora-adapters), and what each request runs with.

Adapters loaded at start (``--lora``, ``--lora-scaled``, a config's ``adapters``) get ids 0,
1, ... in their order; an adapter of ``lora_dir`` that a request's ``model`` names is loaded on
demand and gets the next id. A request runs with (llama-server's rules):

- a non-empty ``lora`` list: each listed id at its scale, every other adapter at 0 (unknown ids
  are ignored);
- no ``lora`` (or an empty one): every adapter at its global scale (POST /lora-adapters);
- a ``model`` that names an adapter: that adapter at the scale it was loaded with, and a
  ``lora`` list on top (it may rescale that adapter too; the global scales do not apply).

The result travels with the request as (name, scale) pairs, so every model replica, one started
later included, runs it alike. Requests using an on-demand adapter carry its name as Ray Serve's
multiplexed model id, which routes them to a replica that holds it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from deployments.api.config import GraphArgs
from deployments.api.errors import invalid
from deployments.api.field_parsers import lora_list
from deployments.api.json_values import f32
from deployments.api.schema import CompletionParams
from engine.adapter_folder import AdapterError, adapter_kind


@dataclass
class Adapter:
    id: int
    name: str
    path: str  # as given (the reference lists the path it was started with)
    scale: float  # the global scale
    loaded_scale: float  # the scale it was loaded with: a request naming it as its model
    on_demand: bool = False

    def listing(self) -> dict:
        """GET /lora-adapters' entry; no aLoRA keys: mlx-lm adapters have no invocation
        tokens, nor GGUF's task_name and prompt_prefix metadata."""
        return {"id": self.id, "path": self.path, "scale": self.scale, "task_name": "",
                "prompt_prefix": ""}


class AdapterTable:
    def __init__(self, args: GraphArgs):
        start = 0.0 if args.lora_init_without_apply else None
        self.adapters = [Adapter(i, s.name, s.given, f32(s.scale if start is None else start),
                                 f32(s.scale)) for i, s in enumerate(args.lora_specs())]
        self.lora_dir = Path(args.lora_dir) if args.lora_dir else None

    def __bool__(self) -> bool:
        return bool(self.adapters) or self.lora_dir is not None

    def find(self, name: str) -> Adapter | None:
        """The adapter of that name: one loaded at start, or registered on demand; else, if
        ``lora_dir`` holds a LoRA adapter folder of that name, that one, registered now."""
        adapter = next((a for a in self.adapters if a.name == name), None)
        if adapter is not None or self.lora_dir is None or not plain_name(name):
            return adapter
        folder = self.lora_dir / name
        if not folder.is_dir():
            return None
        try:
            kind = adapter_kind(folder)
        except AdapterError as exc:
            raise invalid(f"adapter '{name}': {exc}") from None
        if kind != "lora":
            raise invalid(f"adapter '{name}' is a {kind} fine-tune: only LoRA adapters are "
                          "loaded on demand (serve it as a model of its own)")
        adapter = Adapter(len(self.adapters), name, str(folder), f32(1.0), f32(1.0),
                          on_demand=True)
        self.adapters.append(adapter)
        return adapter

    def listing(self) -> list[dict]:
        return [a.listing() for a in self.adapters]

    def set_scales(self, body: Any) -> None:
        """POST /lora-adapters: listed ids at their scale, every other adapter at 0."""
        if not isinstance(body, list):
            raise invalid("Request body must be an array")
        scales = {e["id"]: e["scale"] for e in lora_list(body)}
        for adapter in self.adapters:
            adapter.scale = scales.get(adapter.id, 0.0)

    def resolve(self, params: CompletionParams, model: Any) -> None:
        """Set the request's adapters from its ``lora`` list and the adapter ``model`` names."""
        named = self.find(model) if isinstance(model, str) and model else None
        if named is not None:
            scales = {named.name: named.loaded_scale}
        elif params.lora:
            scales = {}
        else:
            scales = {a.name: a.scale for a in self.adapters}
        by_id = {a.id: a for a in self.adapters}
        for entry in params.lora:  # unknown ids are ignored
            if entry["id"] in by_id:
                scales[by_id[entry["id"]].name] = entry["scale"]
        params.adapters = tuple(sorted((n, s) for n, s in scales.items() if s != 0.0))
        params.adapter_model = named.name if named is not None else ""
        on_demand = {a.name for a in self.adapters if a.on_demand}
        params.multiplex_id = next((n for n, _ in params.adapters if n in on_demand), "")


def plain_name(name: str) -> bool:
    """A folder name inside lora_dir, nothing that leaves it."""
    return bool(name) and "/" not in name and "\\" not in name and not name.startswith(".")
