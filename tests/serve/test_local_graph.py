"""The graph in-process on the fake engine (tests/local_graph.py): the real ingress, shaper and
replica classes, no Ray, no model. It answers as the served graph does where the model adds
nothing: a stream refused before its first frame is plain JSON (the shaper's in-band Refusal),
an accepted one is SSE frames that add up to the answer, the envelope is the reference's."""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import pytest

from ..local_graph import local_graph


@pytest.fixture(scope="module")
def client() -> Iterator[httpx.Client]:
    with local_graph({"n_parallel": 2, "n_ctx": 128}) as c:
        yield c


def test_a_refused_stream_is_plain_json(client):
    r = client.post("/completion", json={"prompt": "hi", "stream": True, "repeat_penalty": 0})
    assert r.status_code == 400 and r.headers["content-type"].startswith("application/json")
    assert r.json()["error"]["message"] == (
        "Failed to initialize samplers: penalty_repeat must be finite and greater than 0")


def test_a_stream_adds_up_to_the_answer(client):
    body = {"prompt": "def f():", "n_predict": 7, "temperature": 0}
    whole = client.post("/completion", json=body).json()
    streamed = client.post("/completion", json={**body, "stream": True})
    assert streamed.headers["content-type"].startswith("text/event-stream")
    frames = [json.loads(line[6:]) for line in streamed.text.splitlines()
              if line.startswith("data: ")]
    assert "".join(f["content"] for f in frames) == whole["content"]
    assert frames[-1]["stop"] and frames[-1]["tokens_predicted"] == 7
    assert (whole["tokens_predicted"], whole["stop_type"]) == (7, "limit")


def test_the_context_limit_is_the_engines_envelope(client):
    r = client.post("/completion", json={"prompt": "x " * 200})
    assert r.status_code == 400
    assert r.json()["error"]["type"] == "exceed_context_size_error"


def test_the_key_check_is_constant_time_and_exact():
    """hmac.compare_digest against every key: a prefix, a longer string or no key is refused."""
    from deployments.serve.endpoint import _known

    keys = ["alpha", "beta-key"]
    assert _known("alpha", keys) and _known("beta-key", keys)
    for given in ("alph", "alphaa", "beta", "", None, "ALPHA"):
        assert not _known(given, keys), given
    assert not _known("", [""]) and not _known(None, keys)
