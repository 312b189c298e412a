"""Back-pressure and faults through the real graph, on a dedicated one-slot graph with a queue of
3: the queue is served in arrival order, past it the answer is 503 at once; a replica killed under
load ends every request in flight with the error envelope, and the graph serves again once Ray
Serve has replaced it; check_health fails when the engine loop has died."""

from __future__ import annotations

import asyncio
import os
import signal
import time

import httpx
import pytest

from .. import conftest
from ..reliability import (
    ENDLESS,
    Frames,
    assert_envelope,
    dedicated_app,
    engine_state,
    engine_state_async,
    wait_engine,
)

APP = "rel-queue"
SHORT = {"n_predict": 2, "temperature": 0, "cache_prompt": False}


@pytest.fixture(scope="module")
def queue_app(serve_instance: int):
    args = {"n_parallel": 1, "max_queue": 3, "n_ctx": 2048}
    with dedicated_app(serve_instance, APP, args, {"health_check_period_s": 1}) as base:
        yield base


def test_one_rule_for_the_replicas_max_ongoing_requests(queue_app):
    """Slots + queue + 16 for control calls, so that the engine's 503 past its queue is what a
    client meets: what Ray Serve records for the running replica (1 slot, a queue of 3), what the
    mlxray command writes, and what every config file leaves to the rule or departs from on
    purpose, saying so on that line."""
    import yaml
    from ray.serve.context import _get_global_client

    from deployments.cli import command as cli

    from ..conftest import MODEL, REPO

    details = _get_global_client().get_serve_details()
    deployment = details["applications"][APP]["deployments"]["ModelReplica"]
    assert deployment["deployment_config"]["max_ongoing_requests"] == 1 + 3 + 16
    config = cli.serve_config(cli.parse(["-m", MODEL, "-np", "2"], {}))
    replica = next(d for d in config["applications"][0]["deployments"]
                   if d["name"] == "ModelReplica")
    assert replica["max_ongoing_requests"] == 2 + 256 + 16
    for path in sorted((REPO / "configs").glob("*.yaml")):
        for app in yaml.safe_load(path.read_text())["applications"]:
            for d in app.get("deployments", []):
                if d["name"].startswith("ModelReplica") and "max_ongoing_requests" in d:
                    line = next(x for x in path.read_text().splitlines()
                                if "max_ongoing_requests" in x and not x.lstrip().startswith("#"))
                    assert "departs from replica_ongoing_limit" in line, path.name


def test_config_files_can_build_the_graph():
    """Each configs/*.yaml is a Serve config whose applications build: ``serve run`` calls the
    builder the way Ray Serve checks it, with one parameter, the application's args."""
    import yaml
    from ray.serve._private.api import call_user_app_builder_with_args_if_necessary
    from ray.serve.schema import ServeDeploySchema

    from deployments.serve.graph import build_app

    from ..conftest import REPO

    configs = sorted((REPO / "configs").glob("*.yaml"))
    assert len(configs) >= 4
    for path in configs:
        config = yaml.safe_load(path.read_text())
        ServeDeploySchema.model_validate(config)
        for app in config["applications"]:
            assert app["import_path"] == "deployments.serve.graph:build_app", path.name
            built = call_user_app_builder_with_args_if_necessary(build_app, app["args"])
            assert type(built).__name__ == "Application", path.name


def test_past_the_queue_bound_is_503_and_the_queue_is_served_in_arrival_order(queue_app):
    async def scenario():
        async with httpx.AsyncClient(base_url=queue_app, timeout=60) as client:
            order: list[int] = []

            async def queued(i: int) -> None:
                r = await client.post("/completion", json={"prompt": f"# request {i}\n", **SHORT})
                assert r.status_code == 200, r.text
                order.append(i)

            async with client.stream("POST", "/completion", json=ENDLESS) as holder:
                holder_frames = Frames(holder)
                await holder_frames.next()
                waiting = []
                for i in range(3):
                    waiting.append(asyncio.create_task(queued(i)))
                    await wait_engine(APP, lambda s, n=i + 1: s["n_waiting"] == n)
                burst = await asyncio.gather(*[
                    client.post("/completion", json={"prompt": "x", **SHORT}) for _ in range(20)
                ])
                held = await engine_state_async(APP)
                await holder_frames.lines.aclose()  # the holder goes away
            await asyncio.gather(*waiting)  # the holder went away: the queue drains
        return burst, held, order

    burst, held, order = asyncio.run(scenario())
    # every refusal came while the slot and the queue were still full: an answer, not a timeout
    assert held["n_active"] == 1 and held["n_waiting"] == 3
    for r in burst:
        assert r.status_code == 503
        assert assert_envelope(503, r.content)["type"] == "unavailable_error"
    assert order == [0, 1, 2]


@pytest.mark.heavy
def test_replica_killed_under_load_fails_in_flight_requests_then_recovers(queue_app):
    """SIGKILL the replica's process (its PID from Ray) while one stream runs and two requests
    wait: each ends with the envelope (an error frame once streaming); the graph then serves,
    the replacement's events on a new connection to the shaper's stream channel."""
    from ray import serve

    shaper = serve.get_deployment_handle("ResponseShaper", app_name=APP)
    pid = engine_state(APP)["pid"]

    async def scenario():
        async with httpx.AsyncClient(base_url=queue_app, timeout=60) as client:
            async with client.stream("POST", "/completion", json=ENDLESS) as running:
                running_frames = Frames(running)
                await running_frames.next()
                waiting_plain = asyncio.create_task(
                    client.post("/completion", json={"prompt": "# waits\n", **SHORT}))
                await wait_engine(APP, lambda s: s["n_waiting"] == 1)
                waiting_stream = asyncio.create_task(client.post(
                    "/completion", json={"prompt": "# waits too\n", "stream": True, **SHORT}))
                await wait_engine(APP, lambda s: s["n_waiting"] == 2)
                os.kill(pid, signal.SIGKILL)
                frames = await running_frames.rest()
            plain, streamed = await asyncio.gather(waiting_plain, waiting_stream)
        return frames, plain, streamed

    frames, plain, streamed = asyncio.run(asyncio.wait_for(scenario(), 60))
    killed_at = time.monotonic()
    assert "error" in frames[-1] and frames[-1]["error"]["code"] in (500, 503)
    assert all("error" not in f for f in frames[:-1])
    for r in (plain, streamed):
        assert r.status_code in (500, 503)
        assert r.headers["content-type"].startswith("application/json")
        assert_envelope(r.status_code, r.content)

    connections = shaper.channel_state.remote().result(timeout_s=30)["connections"]
    recovery = serves_again(queue_app, timeout=90) - killed_at
    assert engine_state(APP)["pid"] != pid
    after = shaper.channel_state.remote().result(timeout_s=30)
    assert after["connections"] == connections + 1 and after["in_flight"] == 0
    print(f"\nreplica SIGKILL: graph served again after {recovery:.1f} s")


@pytest.mark.heavy
def test_shaper_killed_mid_stream_ends_the_stream_with_an_error_frame(queue_app):
    """SIGKILL the response shaper's process while a stream runs: the ingress's channel from it
    breaks, and the client's stream ends with the error frame (deployments/serve/app.py's
    EnvelopeOnFailure); the engine drops the request (the replica can no longer send its
    events); the replacement shaper streams on a new connection to the ingress's channel."""
    from ray import serve

    shaper = serve.get_deployment_handle("ResponseShaper", app_name=APP)
    ingress = serve.get_deployment_handle("Ingress", app_name=APP)
    pid = shaper.channel_state.remote().result(timeout_s=30)["pid"]
    cancelled = engine_state(APP)["n_cancelled"]

    async def scenario():
        async with httpx.AsyncClient(base_url=queue_app, timeout=60) as client:
            async with client.stream("POST", "/completion", json=ENDLESS) as running:
                frames = Frames(running)
                await frames.next()  # the shaper is connected to the ingress's listener now
                connections = (await ingress.channel_state.remote())["connections"]
                os.kill(pid, signal.SIGKILL)
                return connections, await frames.rest()

    connections, frames = asyncio.run(asyncio.wait_for(scenario(), 60))
    assert frames[-1]["error"]["code"] == 503
    assert all("error" not in f for f in frames[:-1])
    state = conftest.wait_for(lambda: (s := engine_state(APP))["n_active"] == 0 and s,
                              timeout=30, what="the engine dropped the orphaned request")
    assert state["n_cancelled"] == cancelled + 1  # cancelled, not run to its 1,500 tokens
    serves_again(queue_app, timeout=90)
    r = httpx.post(queue_app + "/completion", json={"prompt": "x", "stream": True, **SHORT},
                   timeout=30)
    assert r.status_code == 200 and r.text.count("data: ") >= 2
    state = shaper.channel_state.remote().result(timeout_s=30)
    assert state["pid"] != pid
    assert ingress.channel_state.remote().result(timeout_s=30)["connections"] == connections + 1


def serves_again(base: str, timeout: float) -> float:
    """Poll a short completion until it is answered 200; every answer meanwhile is an envelope."""
    deadline = time.monotonic() + timeout
    with httpx.Client(base_url=base, timeout=15) as client:
        while time.monotonic() < deadline:
            try:
                r = client.post("/completion", json={"prompt": "x", **SHORT})
            except httpx.TimeoutException:
                continue
            if r.status_code == 200:
                return time.monotonic()
            assert r.status_code in (500, 503), r.text
            assert_envelope(r.status_code, r.content)
            time.sleep(0.2)
    raise AssertionError(f"the graph did not serve again within {timeout}s")


@pytest.mark.heavy
def test_check_health_fails_when_the_engine_loop_dies_and_ray_replaces_the_replica(queue_app):
    from ray import serve

    replica = serve.get_deployment_handle("ModelReplica", app_name=APP)
    pid = engine_state(APP)["pid"]
    replica.check_health.remote().result(timeout_s=30)  # healthy
    replica.kill_engine_loop.remote().result(timeout_s=30)
    with pytest.raises(Exception, match="engine loop died"):
        replica.check_health.remote().result(timeout_s=30)
    r = httpx.post(queue_app + "/completion", json={"prompt": "x", **SHORT}, timeout=30)
    assert r.status_code in (500, 503)
    assert_envelope(r.status_code, r.content)
    killed_at = time.monotonic()
    recovery = serves_again(queue_app, timeout=90) - killed_at
    assert engine_state(APP)["pid"] != pid
    print(f"\nengine loop death: replaced and serving after {recovery:.1f} s")
