"""Whether a model replica holds its model now: loaded at start, or loaded and unloaded at run time.

Router mode (``--models-dir``) loads a model on its first request and unloads it when the router
evicts it (deployments/serve/model_router.py); ``--sleep-idle-seconds N`` unloads it after N
seconds without a request, and the next request loads it again. Loads and unloads take turns
(one asyncio lock); the requests being answered are counted, so an idle model alone is unloaded.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import sys
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

from engine.seam import EngineLike
from engine.types import EngineError

log = logging.getLogger("mlxray.replica")

LOADING = EngineError("Loading model", 503, "unavailable_error")


def memory_in_use() -> int:
    """MLX's active and cached bytes in this process (0 where MLX was never imported: the fake
    engine)."""
    mx = sys.modules.get("mlx.core")
    return mx.get_active_memory() + mx.get_cache_memory() if mx is not None else 0


def _stop(held: list[EngineLike]) -> int:
    """Stop the engine ``held`` holds, the last reference to it, and release its arrays; the
    bytes this freed."""
    before = memory_in_use()
    held[0].stop()
    held.clear()
    gc.collect()
    mx = sys.modules.get("mlx.core")
    if mx is not None:
        mx.clear_cache()
    return max(0, before - memory_in_use())


class Residency:
    """The engine of one replica, made by ``make`` (a blocking call, run in a thread)."""

    def __init__(self, make: Callable[[], EngineLike], on_demand: bool, sleep_idle_s: int,
                 forget: Callable[[], None] = lambda: None):
        """``forget`` drops what else refers to the engine, before it is unloaded."""
        self._make = make
        self._forget = forget
        self.on_demand = on_demand or sleep_idle_s > 0  # a request loads a model not loaded
        self.sleep_idle_s = sleep_idle_s
        self.engine: EngineLike | None = None
        self.status = "unloaded"  # loading, loaded, sleeping (llama-server's router statuses)
        self.error: BaseException | None = None  # the last load's failure
        self.active = 0  # requests being answered
        self.last_used = time.monotonic()
        self.last_metrics: dict | None = None  # the snapshot taken when it last unloaded
        self.loads = 0
        self.freed = 0  # bytes the last unload freed
        self._turns = asyncio.Lock()

    async def load(self) -> EngineLike:
        async with self._turns:
            if self.engine is not None:
                return self.engine
            self.status = "loading"
            try:
                engine = await asyncio.to_thread(self._make)
            except BaseException as exc:
                log.exception("model load failed")
                self.status, self.error = "unloaded", exc
                raise
            self.engine, self.status, self.error = engine, "loaded", None
            self.loads += 1
            self.last_used = time.monotonic()
            return engine

    async def unload(self, status: str = "unloaded", only_idle: bool = True) -> dict:
        """Unload the model unless it is answering a request (``only_idle``); what happened and
        the bytes it freed."""
        async with self._turns:
            engine = self.engine
            if engine is None:
                return {"unloaded": False, "status": self.status, "freed_bytes": 0}
            if only_idle and self.active:
                return {"unloaded": False, "status": self.status, "busy": True,
                        "freed_bytes": 0}
            self.engine = None  # the status changes once the memory is freed, not before
            self._forget()
            self.last_metrics = engine.metrics_snapshot()
            held = [engine]
            del engine
            freed = self.freed = await asyncio.to_thread(_stop, held)
            self.status = status
            log.info("model %s: %d bytes freed", status, freed)
            return {"unloaded": True, "status": status, "freed_bytes": freed}

    async def current(self) -> EngineLike:
        """The engine, loaded first where requests load it; else 503 "Loading model"."""
        if self.engine is not None:
            return self.engine
        if not self.on_demand:
            if self.error is not None:
                raise EngineError(f"model load failed: {self.error}", 500, "server_error")
            raise LOADING
        try:
            return await self.load()
        except Exception as exc:
            raise EngineError(f"model failed to load: {exc}", 500, "server_error") from exc

    @asynccontextmanager
    async def busy(self) -> AsyncIterator[None]:
        """One request being answered, from here to its end."""
        self.active += 1
        try:
            yield
        finally:
            self.active -= 1
            self.last_used = time.monotonic()

    @asynccontextmanager
    async def use(self) -> AsyncIterator[EngineLike]:
        """The engine for one request, which counts as busy until it ends."""
        async with self.busy():
            yield await self.current()

    async def sleep_when_idle(self) -> None:
        """Unload the model once it has had no request for ``sleep_idle_s`` seconds (forever)."""
        period = min(1.0, self.sleep_idle_s / 4)
        while True:
            await asyncio.sleep(period)
            idle = time.monotonic() - self.last_used
            if self.status == "loaded" and not self.active and idle >= self.sleep_idle_s:
                await self.unload("sleeping")

    def state(self) -> dict:
        failed = self.error is not None and self.status == "unloaded"
        return {"status": self.status, "active": self.active, "loads": self.loads,
                "memory_bytes": memory_in_use(), "freed_bytes": self.freed, "failed": failed,
                "error": str(self.error) if failed else None}
