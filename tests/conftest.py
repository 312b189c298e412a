"""One Ray Serve instance for the whole test session, on a free port, with the conformance
graph (the reference server's settings) deployed at "/". Tests that need other settings deploy
their own application under another route prefix through ``deploy_app``."""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from deployments.cli.launch import cluster_env_defaults

from .zoo import zoo  # noqa: F401 - the session's model zoo (small random-weight folders)

cluster_env_defaults()  # the cluster the suite starts is set up as the command's
os.environ.setdefault("RAY_SERVE_LOG_TO_STDERR", "0")

REPO = Path(__file__).resolve().parent.parent
MODEL = str(REPO / "models" / "tiny-python")
CAPTURES = Path(__file__).resolve().parent / "fixtures" / "captures"

# the reference's settings (../shared/reference/README.md), and Vertex AI's routes as
# AIP_MODE=PREDICTION AIP_HEALTH_ROUTE=/aip/health give them (tests/serve/test_vertex.py)
CONFORMANCE_ARGS = {"model": MODEL, "alias": "tiny-python", "n_parallel": 4, "n_ctx": 2048,
                    "n_batch": 64, "metrics": True, "predict_route": "/predict",
                    "health_route": "/aip/health"}


def up(engine):
    """``engine`` started, its loop running (so its BatchGenerator, ``_bg``, exists)."""
    engine.start()
    engine.run_on_loop(lambda _: None)
    return engine


def running_engine(n_parallel: int) -> Iterator:
    """An engine on the embedded model (no Ray), for a module-scoped fixture to yield."""
    from engine.model import load_model
    from engine.scheduler import Engine, EngineConfig

    eng = up(Engine(load_model(MODEL), EngineConfig(n_parallel=n_parallel, n_ctx=512,
                                                    n_batch=16)))
    yield eng
    eng.stop()


def run_engine(engine, *requests) -> list:
    """Every event of one group of requests, in order."""
    import asyncio

    from engine import aio

    async def collect() -> list:
        events = []
        async for batch in aio.generate(engine, list(requests)):
            events += batch
        return events

    return asyncio.run(collect())


def mlx_lm_ids(model, prompt: list[int], n: int, **kwargs) -> list[int]:
    """mlx-lm's own ``generate_step``: the first ``n`` token ids (end of generation ignored)."""
    import mlx.core as mx
    from mlx_lm.generate import generate_step

    steps = generate_step(mx.array(prompt), model, **kwargs)
    return [int(token) for (token, _), _ in zip(steps, range(n))]


@contextmanager
def batch_sizes(engine) -> Iterator[list[int]]:
    """The sequences each engine step decodes, step by step, while inside."""
    steps: list[int] = []
    original = engine._bg.next

    def counting_next():
        prompt_responses, generation_responses = original()
        steps.append(len(generation_responses))
        return prompt_responses, generation_responses

    engine._bg.next = counting_next
    try:
        yield steps
    finally:
        del engine._bg.next


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(condition: Callable[[], object], timeout: float = 60.0, what: str = "condition",
             poll: float = 0.2) -> object:
    """``condition()``'s first truthy value, asked every ``poll`` seconds until ``timeout``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(poll)
    raise AssertionError(f"timed out waiting for {what}")


def wait_healthy(base: str, timeout: float = 120.0,
                 still_starting: Callable[[], None] | None = None) -> None:
    """Until /health answers 200; ``still_starting`` may raise to give up early."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if still_starting is not None:
            still_starting()
        try:
            if httpx.get(base + "/health", timeout=5).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    raise TimeoutError(f"{base} did not become healthy")


def start_ray(ray, attempts: int = 3) -> None:
    """A local cluster; on an overloaded machine the raylet can miss Ray's fixed 30 s startup
    window, so try again rather than fail the whole session."""
    for attempt in range(attempts):
        try:
            # logical CPUs, for accounting only: the suite's graphs stay deployed side by side
            # (the zoo's models come last); 32 ran out once the suite had grown
            ray.init(address="local", num_cpus=64, include_dashboard=False,
                     log_to_driver=False, configure_logging=False)
            return
        except Exception:
            ray.shutdown()
            if attempt == attempts - 1:
                raise


@pytest.fixture(scope="session")
def serve_instance() -> Iterator[int]:
    import ray
    from ray import serve

    port = free_port()
    start_ray(ray)
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    yield port
    serve.shutdown()
    ray.shutdown()


@pytest.fixture(scope="session")
def deploy_app(serve_instance: int) -> Callable[..., str]:
    """deploy_app(name, args) -> base URL of a graph deployed under /<name>; ``replica_options``
    are ModelReplica's deployment options (replicas, autoscaling, router); ``engine`` its
    engine's maker (``FAKE``: engine/fake.py's, for tests a model adds nothing to)."""
    from ray import serve

    from deployments.api.config import GraphArgs
    from deployments.serve.graph import build_graph

    deployed: dict[str, str] = {}

    def deploy(name: str, args: dict, prefix: str | None = None,
               replica_options: dict | None = None, engine=None) -> str:
        if name in deployed:
            return deployed[name]
        route = "/" if prefix == "/" else f"/{prefix or name}"
        app = build_graph(GraphArgs.model_validate(args), replica_options, engine)
        serve.run(app, name=name, route_prefix=route, blocking=False)
        base = f"http://127.0.0.1:{serve_instance}" + ("" if route == "/" else route)
        wait_healthy(base)
        deployed[name] = base
        return base

    return deploy


@pytest.fixture(scope="session")
def base_url(deploy_app) -> str:
    """The conformance graph, deployed first so the cache captures see a fresh server."""
    return deploy_app("conformance", CONFORMANCE_ARGS, prefix="/")


@pytest.fixture()
def client(base_url: str) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=base_url, timeout=120) as c:
        yield c


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The conformance replay runs first, whatever the file names: its cache captures need the
    conformance graph fresh, before any other test has sent it a prompt."""
    items.sort(key=lambda item: item.path.name != "test_conformance.py")


def pytest_unconfigure(config) -> None:
    """The threads still alive when the session ends (one left running aborts the exit)."""
    import sys
    import threading

    alive = [t for t in threading.enumerate() if t is not threading.main_thread()]
    if alive:
        print("\nthreads alive at exit:", ", ".join(
            f"{t.name}({'daemon' if t.daemon else 'non-daemon'}, {t.native_id})" for t in alive),
            file=sys.stderr)
