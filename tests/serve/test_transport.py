"""The graph's two handle transports (GraphArgs.handle_transport): Ray Serve's gRPC by value, the
default, and Ray object references; and its two ways of carrying stream items
(GraphArgs.stream_channel): shared channels, the default, and a Ray Serve stream per request. The
same requests get the same answers, streamed and not, native and OpenAI, an error envelope
included, and a client that goes away frees its slot on each."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from deployments.api.config import GraphArgs

from .. import conftest
from ..reliability import dedicated_app, engine_state

GREEDY = {"prompt": "def add(a, b):", "n_predict": 12, "temperature": 0, "cache_prompt": False}
OAI = {"model": "tiny-python", "prompt": "import os\n", "max_tokens": 8, "temperature": 0}


def answers(base: str) -> list:
    with httpx.Client(base_url=base, timeout=60) as client:
        native = client.post("/completion", json=GREEDY).json()
        streamed = client.post("/completion", json={**GREEDY, "stream": True}).text
        oai = client.post("/v1/completions", json=OAI).json()
        refused = client.post("/completion", json={**GREEDY, "repeat_penalty": 0})
    frames = [json.loads(line[6:]) for line in streamed.splitlines() if line.startswith("data: ")]
    return [native["content"], native["tokens_predicted"], [f["content"] for f in frames],
            oai["choices"][0]["text"], refused.status_code, refused.json()]


def conformance_variant(serve_instance: int, name: str, **overrides):
    """The conformance app's settings with ``overrides``, as an application of its own."""
    args = {**conftest.CONFORMANCE_ARGS, **overrides}
    args.pop("model")
    return dedicated_app(serve_instance, name, args)


@pytest.fixture(scope="module")
def by_reference(serve_instance: int):
    with conformance_variant(serve_instance, "transport-ray", handle_transport="ray") as base:
        yield base


@pytest.fixture(scope="module")
def per_request(serve_instance: int):
    with conformance_variant(serve_instance, "stream-per-request",
                             stream_channel="per_request") as base:
        yield base


def test_grpc_is_the_default(base_url):
    """The handles the graph builds carry the transport: by value over gRPC unless told ``ray``."""
    from ray import serve

    handle = serve.get_deployment_handle("ResponseShaper", app_name="conformance")
    assert GraphArgs().handle(handle).handle_options._by_reference is False
    by_ref = GraphArgs.model_validate({"handle_transport": "ray"}).handle(handle)
    assert by_ref.handle_options._by_reference is True
    assert GraphArgs().handle(handle).options(stream=True).handle_options._by_reference is False
    with pytest.raises(ValueError):
        GraphArgs.model_validate({"handle_transport": "pigeon"})


def test_both_transports_answer_alike(base_url, by_reference):
    grpc = answers(base_url)
    assert grpc == answers(by_reference)
    assert grpc[4] == 400 and "penalty_repeat" in grpc[5]["error"]["message"]


def test_both_stream_channels_answer_alike(base_url, per_request):
    from ray import serve

    assert GraphArgs().stream_channel == "shared"
    with pytest.raises(ValueError):
        GraphArgs.model_validate({"stream_channel": "pigeon"})
    assert answers(base_url) == answers(per_request)
    for name in ("ResponseShaper", "Ingress"):  # the setting is taken: nothing on a channel
        handle = serve.get_deployment_handle(name, app_name="stream-per-request")
        assert handle.channel_state.remote().result(timeout_s=30)["items"] == 0


@pytest.mark.parametrize("which", ["grpc", "ray", "per_request"])
def test_a_client_gone_mid_stream_frees_its_slot(which, request):
    """The stream would run to the slot's context (2,048 tokens): the engine counts it cancelled,
    and the slot is free well before the end it would have reached."""
    fixture, app = {"grpc": ("base_url", "conformance"), "ray": ("by_reference", "transport-ray"),
                    "per_request": ("per_request", "stream-per-request")}[which]
    base = request.getfixturevalue(fixture)
    endless = {"prompt": [5, 6, 7], "n_predict": 100000, "ignore_eos": True, "stream": True}
    cancelled = engine_state(app)["n_cancelled"]

    async def read_a_little_and_leave():
        async with httpx.AsyncClient(base_url=base, timeout=60) as client:
            async with client.stream("POST", "/completion", json=endless) as r:
                async for _ in r.aiter_bytes():
                    break

    asyncio.run(read_a_little_and_leave())
    state = conftest.wait_for(lambda: (s := engine_state(app))["n_cancelled"] > cancelled and s,
                              timeout=30, what="the request cancelled")
    assert state["n_cancelled"] == cancelled + 1
    conftest.wait_for(lambda: engine_state(app)["n_active"] == 0, timeout=10,
                      what="the slot freed")


def replica_handle(app: str, stream: bool):
    from ray import serve

    handle = serve.get_deployment_handle("ModelReplica", app_name=app)
    return GraphArgs().handle(handle).options(stream=stream)


def test_a_call_over_4_mib_reaches_the_replica(base_url):
    """Serve caps a gRPC message at 4 MiB unless told otherwise (CLUSTER_ENV and the configs'
    runtime_env raise it): 2M prompt tokens (5 MiB pickled) get the engine's own answer, the
    context refusal, not RESOURCE_EXHAUSTED."""
    from deployments.api.engine_requests import to_requests
    from deployments.serve.endpoint import ModelEndpoint
    from deployments.serve.routes.native import prepare
    from engine.vocab import load_vocab

    args = GraphArgs(model=conftest.MODEL)
    params, _ = prepare(ModelEndpoint(None, None, args, load_vocab(args.model_path)),
                        {"prompt": "x", "n_predict": 1})
    prompts = [[5 + (i + j) % 1000 for j in range(100_000)] for i in range(20)]

    async def first_batch():
        requests = to_requests(params, prompts)
        async for batch in replica_handle("conformance", stream=True).generate.remote(requests):
            return batch

    (event,) = asyncio.run(first_batch())
    assert event.code == 400 and "exceeds the available context size" in event.message


def test_an_answer_over_4_mib_comes_back(base_url):
    """1,500 prompts' per-token embeddings: about 5 MiB back from the replica."""
    prompts = [[5 + i % 900, 6, 7] for i in range(1500)]
    answer = replica_handle("conformance", stream=False).embed.remote(prompts, "none")
    vectors = answer.result(timeout_s=120)["result"]
    assert len(vectors) == 1500 and len(vectors[0]) == 3
