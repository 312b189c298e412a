"""Scaling out: configs/autoscale.yaml, prefix-aware routing between two replicas, and the
autoscaler going from 1 replica to 2 under load and back."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml

from tests.reliability import dedicated_app

AUTOSCALE_YAML = Path(__file__).resolve().parents[2] / "configs" / "autoscale.yaml"


def autoscale_config() -> dict:
    return yaml.safe_load(AUTOSCALE_YAML.read_text())


def replica_section(config: dict) -> dict:
    deployments = config["applications"][0]["deployments"]
    return next(d for d in deployments if d["name"] == "ModelReplica")


def test_autoscale_yaml_is_a_valid_serve_config():
    from ray.serve import Application
    from ray.serve._private.api import call_user_app_builder_with_args_if_necessary
    from ray.serve.schema import ServeDeploySchema

    from deployments.api.config import GraphArgs
    from deployments.serve.graph import build_app

    config = autoscale_config()
    ServeDeploySchema.model_validate(config)
    app_args = config["applications"][0]["args"]
    args = GraphArgs.model_validate(app_args)
    # what `serve run` does with import_path and args
    assert isinstance(call_user_app_builder_with_args_if_necessary(build_app, app_args),
                      Application)
    replica = replica_section(config)
    scaling = replica["autoscaling_config"]
    assert scaling["target_ongoing_requests"] == 0.75 * args.n_parallel
    assert replica["max_ongoing_requests"] == 2 * args.n_parallel
    assert scaling["min_replicas"] == 1 < scaling["max_replicas"]


def running_replicas(app: str) -> int:
    from ray import serve
    from ray.serve._private.common import ReplicaState

    status = serve.status().applications[app].deployments["ModelReplica"]
    return status.replica_states.get(ReplicaState.RUNNING, 0)


def wait_all_loaded(app: str, replicas: int, timeout: float = 120) -> None:
    """Every replica RUNNING and its model loaded: ``ready`` answers True many times in a row
    (routing spreads the probes), so no test request meets a 503 "Loading model"."""
    from ray import serve

    handle = serve.get_deployment_handle("ModelReplica", app_name=app)
    deadline, in_a_row = time.monotonic() + timeout, 0
    while in_a_row < 8 * replicas:
        assert time.monotonic() < deadline, f"{app}: replicas not loaded"
        ready = running_replicas(app) == replicas and handle.ready.remote().result()
        in_a_row = in_a_row + 1 if ready else 0
        if not ready:
            time.sleep(0.2)


PREFIX_ROUTER = {
    "request_router_class": "deployments.serve.router:PrefixAffinityRouter",
    "request_router_kwargs": {"imbalanced_threshold": 4},
}


@pytest.fixture()
def prefix_app(serve_instance: int) -> Iterator[str]:
    """Two replicas behind the prefix router, deleted after the test."""
    options = {"num_replicas": 2, "request_router_config": PREFIX_ROUTER}
    with dedicated_app(serve_instance, "prefix", {"n_parallel": 2, "n_ctx": 1024},
                       options) as base:
        yield base


@pytest.mark.heavy
def test_prefix_routing_sends_repeats_to_the_replica_holding_the_prefix(prefix_app):
    """Two replicas: every repeat of a prompt lands where its prefix is cached (random routing
    would miss about half the time)."""
    base = prefix_app
    wait_all_loaded("prefix", 2)
    prompts = [f"{name} = {k}\n" * 12 + f"def {name}_f(x):\n"
               for k, name in enumerate(["alpha", "bravo", "charlie", "delta"])]
    cache_n = []
    with httpx.Client(base_url=base, timeout=60) as client:
        for prompt in prompts * 4:
            r = client.post("/completion", json={"prompt": prompt, "n_predict": 2,
                                                 "temperature": 0})
            assert r.status_code == 200, r.text
            cache_n.append(r.json()["timings"]["cache_n"])
    first, repeats = cache_n[:len(prompts)], cache_n[len(prompts):]
    assert all(n > max(first) for n in repeats), cache_n


def test_prefix_router_keys_by_token_ids():
    from deployments.serve.router import PrefixAffinityRouter, tokens_as_text

    assert tokens_as_text([0, 317, 523]) == "\x00\u013d\u020b"
    extract = PrefixAffinityRouter._extract_text_from_request

    from engine.types import GenerationRequest

    class Pending:
        def __init__(self, *args):
            self.args = list(args)

    requests = [GenerationRequest([0, 317]), GenerationRequest([0, 9])]
    assert extract(None, Pending(requests)) == tokens_as_text([0, 317])
    assert extract(None, Pending(requests, "reply")) == tokens_as_text([0, 317])  # push()
    assert extract(None, Pending()) is None  # ready(), model_info(): power of two choices


@pytest.fixture()
def autoscale_app(serve_instance: int) -> Iterator[str]:
    """configs/autoscale.yaml's ModelReplica settings with max 2 replicas and short delays,
    deleted after the test."""
    replica = replica_section(autoscale_config())
    scaling = {**replica["autoscaling_config"], "min_replicas": 1, "initial_replicas": 1,
               "max_replicas": 2, "target_ongoing_requests": 1.5, "upscale_delay_s": 0.5,
               "downscale_delay_s": 2, "look_back_period_s": 1, "metrics_interval_s": 0.2}
    options = {"autoscaling_config": scaling, "max_ongoing_requests": 4,
               "request_router_config": PREFIX_ROUTER}
    with dedicated_app(serve_instance, "autoscale", {"n_parallel": 2, "n_ctx": 512},
                       options) as base:
        yield base


@pytest.mark.heavy
def test_autoscaling_goes_to_two_replicas_under_load_and_back(autoscale_app):
    """configs/autoscale.yaml's ModelReplica settings with max 2 replicas and short delays."""
    base = autoscale_app
    assert running_replicas("autoscale") == 1

    async def load(stop: asyncio.Event) -> None:
        body = {"n_predict": 400, "ignore_eos": True, "temperature": 0, "cache_prompt": False}

        async def one(client: httpx.AsyncClient, k: int) -> None:
            while not stop.is_set():
                await client.post("/completion", json={**body, "prompt": f"x_{k} = {k}\n"})

        async with httpx.AsyncClient(base_url=base, timeout=120) as client:
            await asyncio.gather(*(one(client, k) for k in range(6)))

    async def scale_up_under_load() -> float:
        stop = asyncio.Event()
        driver = asyncio.ensure_future(load(stop))
        started = time.monotonic()
        try:
            while running_replicas("autoscale") < 2:
                assert time.monotonic() - started < 90, "did not scale up"
                await asyncio.sleep(0.5)
            return time.monotonic() - started
        finally:
            stop.set()
            await driver

    asyncio.run(scale_up_under_load())
    deadline = time.monotonic() + 90
    while running_replicas("autoscale") > 1:
        assert time.monotonic() < deadline, "did not scale back down"
        time.sleep(0.5)


def test_serve_status_shows_a_replica_whose_engine_cannot_run(serve_instance, tmp_path):
    """check_health fails once the model load failed (or the engine loop died): Serve marks the
    deployment UNHEALTHY, as `serve status` prints it, and keeps replacing the replica."""
    from ray import serve
    from ray.serve._private.common import DeploymentStatus

    from deployments.api.config import GraphArgs
    from deployments.serve.graph import build_graph

    not_a_model = tmp_path / "not-a-model"
    not_a_model.mkdir()
    app = build_graph(GraphArgs(model=str(not_a_model)),
                      {"health_check_period_s": 0.5, "health_check_timeout_s": 5})
    try:
        serve.run(app, name="broken", route_prefix=None)
    except RuntimeError:
        pass  # the first health check may already fail the deploy
    deadline = time.monotonic() + 60
    while True:
        status = serve.status().applications["broken"].deployments["ModelReplica"]
        if status.status in (DeploymentStatus.UNHEALTHY, DeploymentStatus.DEPLOY_FAILED):
            break
        assert time.monotonic() < deadline, status
        time.sleep(0.5)
    serve.delete("broken", _blocking=False)
