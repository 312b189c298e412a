"""The graph in the test's own process, without Ray: the real Ingress (its FastAPI app, through
httpx's ASGI transport), ResponseShaper and ModelReplica classes, wired by in-process handles,
on engine/fake.py's engine. For the tests of routes, validation, envelopes, shaping and SSE
framing, where neither a model nor Ray adds anything: no cluster, no actor, no weights. A test
that needs the model's own answers but not Ray (the fuzz: thousands of small requests) passes
``engine=engines.mlx_engine``.

What crosses a hop is copied (pickled) as a Ray Serve handle copies it. Streams are
``per_request`` (the shared channel's sockets are between processes: tests/serve/test_channel.py).
"""

from __future__ import annotations

import asyncio
import inspect
import pickle
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
from transformers import AutoTokenizer  # noqa: F401 - imported once, before two threads race to

from deployments.api.config import GraphArgs
from deployments.serve import engines
from deployments.serve.ingress import Ingress, app
from deployments.serve.replica import ModelReplica
from deployments.serve.shaper import ResponseShaper

MODEL = str(Path(__file__).resolve().parent.parent / "models" / "tiny-python")



class LocalHandle:
    """A DeploymentHandle's calls on an object in this process: ``.options(stream=...)`` and
    ``.method.remote(*args)``, awaited (a call) or iterated (a stream)."""

    def __init__(self, target: Any, stream: bool = False):
        self._target, self._stream = target, stream

    def options(self, stream: bool | None = None, **_: Any) -> LocalHandle:
        return LocalHandle(self._target, self._stream if stream is None else stream)

    def __getattr__(self, name: str) -> Any:
        method = getattr(self._target, name)
        stream = self._stream

        class Call:
            @staticmethod
            def remote(*args: Any) -> Any:
                args = pickle.loads(pickle.dumps(args))  # by value, as a handle sends them
                return method(*args) if stream else _copied(method(*args))

        return Call


async def _copied(call: Any) -> Any:
    return pickle.loads(pickle.dumps(await call))


def _servable_dependency() -> Any:
    """The dependency Serve's class-based view gives each route for ``self``."""
    for route in _routes(app.router):
        self_default = inspect.signature(route.endpoint).parameters["self"].default
        return self_default.dependency
    raise AssertionError("the ingress has no routes")


def engine_state(replica: Any) -> dict:
    """The local replica's ``engine_state``, as tests/reliability.py's reads a deployed one's."""
    return asyncio.run(replica.engine_state())


def _routes(router: Any) -> Iterator[Any]:
    for route in router.routes:
        if hasattr(route, "original_router"):
            yield from _routes(route.original_router)
        elif hasattr(route, "endpoint") and "self" in inspect.signature(route.endpoint).parameters:
            yield route


class _Loop:
    """One event loop on a thread of its own: the graph's tasks outlive a single request."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, coro: Any, timeout: float = 120.0) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def close(self) -> None:
        # the executor's threads ran MLX (the engine loads in one): they end here, not after
        # the interpreter began finalizing, where MLX's thread-local destructors abort the exit
        self.run(self.loop.shutdown_default_executor(), timeout=30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)


@contextmanager
def local_graph(args: dict | None = None,
                engine: engines.EngineMaker = engines.fake) -> Iterator[httpx.Client]:
    """An httpx client on a graph of ``args`` (the model: tests/conftest.py's MODEL), in-process
    on ``engine``; the graph is torn down afterwards."""
    with local_graph_parts(args, engine) as (client, _):
        yield client


@contextmanager
def local_graph_parts(args: dict | None = None, engine: engines.EngineMaker = engines.fake
                      ) -> Iterator[tuple[httpx.Client, Any]]:
    """local_graph's client and its ModelReplica (for its ``engine_state``)."""
    config = GraphArgs.model_validate({"model": MODEL, "stream_channel": "per_request",
                                       **(args or {})})
    runner = _Loop()

    async def build() -> tuple[Any, Any]:
        replica = ModelReplica.func_or_class(config, engine)
        shaper = ResponseShaper.func_or_class(LocalHandle(replica), config)
        ingress_cls = Ingress.func_or_class.__mro__[1]  # the class under Serve's ASGI wrapper
        return replica, ingress_cls([(LocalHandle(shaper), LocalHandle(replica), config)], config)

    replica, ingress = runner.run(build())
    deadline = time.monotonic() + 60
    while replica.engine is None:
        if replica.residency.error is not None:
            raise replica.residency.error
        assert time.monotonic() < deadline, "the fake engine did not start"
        time.sleep(0.01)
    dependency = _servable_dependency()
    app.dependency_overrides[dependency] = lambda: ingress
    transport = _ThreadedTransport(runner)
    try:
        with httpx.Client(transport=transport, base_url="http://local", timeout=60) as client:
            yield client, replica
    finally:
        app.dependency_overrides.pop(dependency, None)
        if replica.engine is not None:
            replica.engine.stop()
        runner.close()


class _ThreadedTransport(httpx.BaseTransport):
    """httpx's ASGI transport driven on the graph's loop, for a synchronous client."""

    def __init__(self, runner: _Loop):
        self.runner = runner
        self.inner = httpx.ASGITransport(app=app)

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        async def send() -> tuple[int, list, bytes]:
            request.stream = httpx.ByteStream(request.read())
            response = await self.inner.handle_async_request(request)
            body = b"".join([part async for part in response.stream])
            return response.status_code, response.headers.raw, body

        status, headers, body = self.runner.run(send())
        return httpx.Response(status, headers=headers, content=body, request=request)
