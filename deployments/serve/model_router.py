"""Router mode on Ray Serve: which models of the folder are loaded, in the ingress's process.

Each model has its own replica deployment (deployments/serve/graph.py), started empty; the router
loads a model on a request for it (one load shared by every request waiting for it), keeps at
most ``models_max`` running and unloads the least recently used idle one to make room. Requests
that find no room wait in turn (one lock, first come first served) until a model goes idle. A
request holds its model (``hold``/``release``) until its answer has been sent, so a model
answering a request is never the one unloaded. Every change is published to ``/models/sse``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextvars import ContextVar
from typing import Any

from deployments.api import router_models as rm
from deployments.api.router_models import ModelState

log = logging.getLogger("mlxray.router")

WAIT_FOR_ROOM_S = 0.5  # a busy victim is asked again this often

# what releases the models an HTTP request holds, called once its answer has been sent
# (deployments/serve/app.py ReleaseHeldModels); None outside an HTTP request
HELD: ContextVar[list[Callable[[], None]] | None] = ContextVar("mlxray_held", default=None)


class ModelRouter:
    def __init__(self, replicas: dict[str, Any], models_max: int, models_autoload: bool,
                 unload_each: Callable[[str], Awaitable[list[dict]]],
                 describe: Callable[[str], Awaitable[dict]], sleep_poll_s: float | None = None):
        """``replicas``: each model's replica handle; ``unload_each(name)``: ask every replica
        of the model to unload (deployments/serve/replicas.py ask_each), their answers;
        ``describe(name)``: a loaded model's own /models entry."""
        self.replicas = replicas
        self.describe = describe
        self.models_max = models_max
        self.autoload = models_autoload
        self.unload_each = unload_each
        self.states = {name: ModelState(name) for name in replicas}
        self.freed: dict[str, int] = {}  # bytes the last unload of each model freed
        self._loads: dict[str, asyncio.Task] = {}
        self._room = asyncio.Lock()
        self._idle = asyncio.Event()  # a model went idle or was unloaded
        self._listeners: set[asyncio.Queue] = set()
        self._sleep_poll_s = sleep_poll_s
        self._background: set[asyncio.Task] = set()
        self._sleep_watch: asyncio.Task | None = None

    # ---- requests -----------------------------------------------------------------------
    async def ensure(self, name: str, autoload: bool, wakes: bool = True) -> None:
        """Return once ``name`` can answer (loaded, or asleep: its replica wakes itself on a
        request that ``wakes`` it, shown loaded from now on; a GET of /props or /metrics does
        not)."""
        self._watch_sleep()
        state = self.states[name]
        state.last_used = time.monotonic()
        if state.status == "sleeping" and wakes:
            state.status = "loaded"
            self._publish(rm.status_change(state))
        if state.status in rm.READY:
            return
        if not state.running and not autoload:
            raise rm.not_loaded()
        await asyncio.shield(self._load_task(name))
        if state.status not in rm.READY:
            raise rm.load_failed(name)

    def hold(self, name: str) -> None:
        self.states[name].requests += 1

    def release(self, name: str) -> None:
        state = self.states[name]
        state.requests = max(0, state.requests - 1)
        state.last_used = time.monotonic()
        if not state.requests:
            self._idle.set()

    def load_at_start(self, names: list[str]) -> None:
        """A preset's load-on-startup models, loaded in the background once the event loop that
        builds the router runs (the ingress's)."""
        try:
            asyncio.get_running_loop()
        except RuntimeError:  # built outside an event loop: the first request loads them
            if names:
                log.warning("no event loop: %s not loaded at start", ", ".join(names))
            return
        for name in names:
            self._load_task(name)

    # ---- /models/load, /models/unload -------------------------------------------------
    def load(self, name: str) -> None:
        self._load_task(name)

    def unload(self, name: str) -> None:
        """Unload ``name`` once the requests it is answering have ended (in the background)."""
        self._spawn(self._drain_and_unload(name))

    async def _drain_and_unload(self, name: str) -> None:
        loading = self._loads.get(name)
        if loading is not None and not loading.done():
            await loading
        while self.states[name].running and not await self._unload(name):
            await self._wait_idle()

    # ---- loading and unloading ------------------------------------------------------------
    def _load_task(self, name: str) -> asyncio.Task:
        task = self._loads.get(name)
        if task is None or task.done():
            task = self._loads[name] = asyncio.ensure_future(self._load(name))
        return task

    async def _load(self, name: str) -> None:
        state = self.states[name]
        if state.running:
            return
        async with self._room:
            await self._make_room(name)
            state.status, state.failed = "loading", False
            self._publish(rm.event(name, "model_status", {"status": "loading"}))
        try:
            answer = await self.replicas[name].load.remote()
            if answer["status"] == "loaded":
                state.info = await self.describe(name)
        except Exception as exc:  # noqa: BLE001 - the replica went away: the load failed
            log.warning("loading %s failed: %r", name, exc)
            answer = {"status": "unloaded"}
        state.last_used = time.monotonic()
        if answer["status"] == "loaded":
            state.status = "loaded"
        else:
            state.status, state.failed, state.exit_code = "unloaded", True, 1
            self._idle.set()
        self._publish(rm.status_change(state))

    async def _make_room(self, name: str) -> None:
        """Unload idle models, least recently used first, until one more fits."""
        while not rm.has_capacity(list(self.states.values()), self.models_max):
            victim = rm.pick_victim(list(self.states.values()), name)
            if victim is None or not await self._unload(victim):
                await self._wait_idle()

    async def _unload(self, name: str) -> bool:
        """Ask the model's replicas to unload it, unless it is answering a request."""
        state = self.states[name]
        if state.requests:
            return False
        answers = await self.unload_each(name)
        if any(a.get("busy") for a in answers):
            return False
        self.freed[name] = sum(a.get("freed_bytes", 0) for a in answers)
        state.status, state.exit_code, state.failed, state.info = "unloaded", 0, False, {}
        self._idle.set()
        self._publish(rm.status_change(state))
        return True

    async def _wait_idle(self) -> None:
        self._idle.clear()
        try:
            await asyncio.wait_for(self._idle.wait(), WAIT_FOR_ROOM_S)
        except TimeoutError:
            pass

    # ---- sleep (--sleep-idle-seconds): each replica unloads itself; the router follows ------
    def _watch_sleep(self) -> None:
        if self._sleep_poll_s and self._sleep_watch is None:
            self._sleep_watch = asyncio.ensure_future(self._follow_sleep())

    async def _follow_sleep(self) -> None:
        while True:
            await asyncio.sleep(self._sleep_poll_s)
            for name, state in self.states.items():
                if state.status not in rm.READY:
                    continue
                try:
                    status = (await self.replicas[name].state.remote())["status"]
                except Exception:  # noqa: BLE001 - asked again next time
                    continue
                if status in rm.READY and status != state.status:
                    state.status = status
                    self._publish(rm.status_change(state))

    # ---- /models/sse ------------------------------------------------------------------------
    def _publish(self, item: dict) -> None:
        for queue in self._listeners:
            queue.put_nowait(item)

    async def events(self) -> AsyncIterator[dict]:
        queue: asyncio.Queue = asyncio.Queue()
        self._listeners.add(queue)
        try:
            while True:
                yield await queue.get()
        finally:
            self._listeners.discard(queue)

    def _spawn(self, work: Any) -> None:
        task = asyncio.ensure_future(work)
        self._background.add(task)
        task.add_done_callback(self._background.discard)
