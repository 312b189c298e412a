"""A model replica's LoRA adapters: those of the config, loaded with the model, and those of
``lora_dir`` loaded on demand through Ray Serve's model multiplexing (deployments/api/adapters.py
resolves what each request runs with)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ray import serve

from deployments.api.adapters import plain_name
from deployments.api.config import GraphArgs
from engine.adapter_folder import AdapterError


class ReplicaAdapters:
    """A model replica's LoRA adapters: those loaded at start, and those of ``lora_dir`` loaded
    on demand through Ray Serve's model multiplexing (``serve.multiplexed``): an LRU of
    ``max_adapters_per_replica`` per replica, the least recently used unloaded past it (once no
    sequence uses it), and the router sends a request to a replica that holds its adapter."""

    def __init__(self, args: GraphArgs):
        self.startup = args.lora_specs()
        self.lora_dir = Path(args.lora_dir) if args.lora_dir else None
        self.engine: Any = None
        self.loads: dict[str, int] = {}  # on-demand loads by name, for tests and operators

    def load_startup(self, engine: Any) -> None:
        """Before the replica is ready: every adapter of the config, on the engine's thread."""
        from engine.lora import read_lora

        self.engine = engine
        specs = self.startup
        engine.run_on_loop(lambda e: [e.adapters.add(read_lora(s.path, s.name)) for s in specs])

    def forget(self) -> None:
        """The engine is being unloaded (router mode, sleep): adapters load on the next one."""
        self.engine = None

    def multiplexed(self, limit: int) -> Callable:
        """The loader Ray Serve multiplexes (a plain function: Serve keeps its LRU on it); the
        replica keeps it as an attribute, where Serve finds it."""
        async def load_adapter(name: str) -> _Loaded:
            return await self._load(name)

        return serve.multiplexed(max_num_models_per_replica=limit)(load_adapter)

    async def hold(self, adapters: tuple[tuple[str, float], ...],
                   load: Callable) -> None:
        """Load the request's on-demand adapters (or mark them recently used)."""
        startup = {s.name for s in self.startup}
        for name, _ in adapters:
            if name not in startup:
                await load(name)

    async def _load(self, name: str) -> _Loaded:
        from engine.lora import read_lora

        if self.lora_dir is None or not plain_name(name):
            raise AdapterError(f"no adapter '{name}' to load")
        path = self.lora_dir / name
        engine = self.engine
        await asyncio.to_thread(engine.run_on_loop,
                                lambda e: e.adapters.add(read_lora(path, name)))
        self.loads[name] = self.loads.get(name, 0) + 1
        return _Loaded(engine, name)


class _Loaded:
    """What the multiplexer holds per on-demand adapter; it calls ``__del__`` (in a thread)
    when it drops the adapter from its LRU."""

    def __init__(self, engine: Any, name: str):
        self.engine, self.name = engine, name

    def __del__(self) -> None:
        engine, self.engine = self.engine, None
        if engine is None or not engine.alive:
            return
        name = self.name
        try:
            engine.run_on_loop(lambda e: e.adapters.remove(name, e.adapters_in_use()))
        except Exception:  # noqa: BLE001 - the replica is going away
            pass
