"""The graph's two handle transports (GraphArgs.handle_transport): Ray Serve's gRPC by value, the
default, and Ray object references. The same requests get the same answers, streamed and not,
native and OpenAI, an error envelope included, and a client that goes away frees its slot on
either."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from deployments.config import GraphArgs

from . import conftest
from .reliability import dedicated_app, engine_state

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


@pytest.fixture(scope="module")
def by_reference(serve_instance: int):
    args = {**conftest.CONFORMANCE_ARGS, "handle_transport": "ray"}
    args.pop("model")
    with dedicated_app(serve_instance, "transport-ray", args) as base:
        yield base


def test_grpc_is_the_default():
    assert GraphArgs().handle_transport == "grpc"
    assert GraphArgs.model_validate({"handle_transport": "ray"}).handle_transport == "ray"
    with pytest.raises(ValueError):
        GraphArgs.model_validate({"handle_transport": "pigeon"})


def test_both_transports_answer_alike(base_url, by_reference):
    grpc = answers(base_url)
    assert grpc == answers(by_reference)
    assert grpc[4] == 400 and "penalty_repeat" in grpc[5]["error"]["message"]


@pytest.mark.parametrize("which", ["grpc", "ray"])
def test_a_client_gone_mid_stream_frees_its_slot(which, base_url, by_reference):
    base, app = (base_url, "conformance") if which == "grpc" else (by_reference, "transport-ray")
    endless = {"prompt": [5, 6, 7], "n_predict": 100000, "ignore_eos": True, "stream": True}

    async def read_a_little_and_leave():
        async with httpx.AsyncClient(base_url=base, timeout=60) as client:
            async with client.stream("POST", "/completion", json=endless) as r:
                async for _ in r.aiter_bytes():
                    break

    asyncio.run(read_a_little_and_leave())
    conftest.wait_for(lambda: engine_state(app)["n_active"] == 0, timeout=30,
                      what="the slot freed")
