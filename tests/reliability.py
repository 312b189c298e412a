"""Helpers of the reliability tests: dedicated graphs, the replica's engine state through Ray, SSE
reading, the error envelope's shape."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import httpx

from .conftest import MODEL, wait_healthy

# a stream that only the n_predict limit ends, long enough to hold a slot for seconds
ENDLESS = {"prompt": "def main():\n", "n_predict": 1500, "ignore_eos": True, "stream": True,
           "temperature": 0, "cache_prompt": False}


@contextmanager
def dedicated_app(port: int, name: str, args: dict,
                  replica_options: dict | None = None) -> Iterator[str]:
    """A graph of its own under /<name> (faults and settings stay away from other tests),
    deleted afterwards."""
    from ray import serve

    from deployments.api.config import GraphArgs
    from deployments.serve.graph import build_graph

    config = GraphArgs.model_validate({"model": MODEL, **args})
    wait_deleted(name)
    serve.run(build_graph(config, replica_options), name=name,
              route_prefix=f"/{name}", blocking=False)
    base = f"http://127.0.0.1:{port}/{name}"
    try:
        wait_healthy(base)
        yield base
    finally:
        # not waited for: the replicas' graceful stop (2 s) runs while the next test starts
        serve.delete(name, _blocking=False)


def wait_deleted(name: str, timeout: float = 120) -> None:
    """Until no application of that name is left (dedicated_app does not wait for its own)."""
    from ray import serve

    deadline = time.monotonic() + timeout
    while name in serve.status().applications:
        if time.monotonic() > deadline:
            raise TimeoutError(f"the application {name} was not deleted in {timeout} s")
        time.sleep(0.2)


def engine_state(app: str) -> dict:
    """The replica's engine bookkeeping, through a Ray Serve handle (not HTTP)."""
    from ray import serve

    handle = serve.get_deployment_handle("ModelReplica", app_name=app)
    return handle.engine_state.remote().result(timeout_s=30)


async def engine_state_async(app: str) -> dict:
    return await asyncio.to_thread(engine_state, app)


async def wait_engine(app: str, condition: Callable[[dict], bool], timeout: float = 10.0) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        state = await engine_state_async(app)
        if condition(state):
            return state
        if time.monotonic() > deadline:
            raise AssertionError(f"engine state not reached in {timeout}s: {state}")
        await asyncio.sleep(0.01)


def is_idle(state: dict) -> bool:
    return (state["n_active"] == 0 and state["n_waiting"] == 0 and state["n_sequences"] == 0
            and all(state["slots_idle"]))


def assert_envelope(status: int, body: bytes | dict) -> dict:
    """A non-200 answer is {"error": {"code": status, "message": str, "type": str, ...}}."""
    data = json.loads(body) if isinstance(body, (bytes, str)) else body
    assert isinstance(data, dict) and set(data) == {"error"}, data
    error = data["error"]
    assert error["code"] == status, data
    assert isinstance(error["message"], str) and isinstance(error["type"], str), data
    return error


def sse_data(line: str) -> dict | None:
    return json.loads(line[6:]) if line.startswith("data: ") else None


class Frames:
    """The data frames of one SSE response, read on demand. Leaving an ``aiter_lines`` loop
    early closes the connection (a disconnect), so one iterator is kept for the whole stream."""

    def __init__(self, response: httpx.Response):
        self.lines = response.aiter_lines()

    async def next(self) -> dict:
        async for line in self.lines:
            frame = sse_data(line)
            if frame is not None:
                return frame
        raise AssertionError("the stream ended before the next frame")

    async def rest(self) -> list[dict]:
        return [f async for line in self.lines if (f := sse_data(line)) is not None]
