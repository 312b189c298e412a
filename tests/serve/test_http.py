"""The native routes through the real graph (ingress -> shaper -> replica) over real HTTP."""

from __future__ import annotations

import asyncio
import json

import httpx

PROMPTS = ["def main():\n", "import os\n", "class Foo:\n    def __init__(self",
           "    for i in range(", "x = 1\n", "def f(a, b):\n", "# comment\n", "for k in d:\n"]


def sse_events(text: str) -> list:
    return [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: ")]


def test_basic_completion_matches_reference(client):
    r = client.post("/completion", json={"prompt": "def main():\n", "n_predict": 16,
                                         "temperature": 0, "cache_prompt": False})
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("application/json")
    assert r.json()["content"] == '    return codecs.CodecInfo(\n    "C'


def test_stream_frames_and_headers(client):
    with client.stream("POST", "/completion", json={
        "prompt": "def main():\n", "n_predict": 5, "temperature": 0, "stream": True,
        "cache_prompt": False,
    }) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        assert r.headers["x-accel-buffering"] == "no"
        events = sse_events(r.read().decode())
    assert [e["stop"] for e in events] == [False] * 5 + [True]
    assert "".join(e["content"] for e in events) == "    return codecs"


def test_concurrent_streams_share_the_batch(base_url):
    """8 streams at once: their frames interleave, and each gets its greedy ids from alone."""
    body = {"n_predict": 24, "temperature": 0, "stream": True, "cache_prompt": False,
            "return_tokens": True}

    async def one(client, prompt, arrivals, tag):
        tokens = []
        async with client.stream("POST", "/completion", json={**body, "prompt": prompt}) as r:
            async for line in r.aiter_lines():
                if line.startswith("data: "):
                    event = json.loads(line[6:])
                    if not event["stop"]:
                        tokens += event["tokens"]
                        arrivals.append(tag)
        return tokens

    async def main():
        async with httpx.AsyncClient(base_url=base_url, timeout=120) as client:
            alone = [await one(client, p, [], i) for i, p in enumerate(PROMPTS)]
            arrivals: list[int] = []
            together = await asyncio.gather(*[one(client, p, arrivals, i)
                                              for i, p in enumerate(PROMPTS)])
        return alone, together, arrivals

    alone, together, arrivals = asyncio.run(main())
    assert together == alone
    # interleaved: some stream received a token before another one had finished
    first_done = {tag: max(i for i, t in enumerate(arrivals) if t == tag) for tag in set(arrivals)}
    starts = {tag: arrivals.index(tag) for tag in set(arrivals)}
    assert any(starts[a] < first_done[b] and a != b for a in starts for b in first_done)


def test_error_envelope_and_status(client):
    r = client.post("/completion", json={"prompt": "x", "n_predict": -2})
    assert r.status_code == 400
    assert r.json() == {"error": {
        "code": 400, "type": "invalid_request_error",
        "message": "Field 'n_predict': Value must be between -1 <= value <= 2147483647, but got -2",
    }}


def test_stream_error_before_first_frame_is_plain_json(client):
    r = client.post("/completion", json={"prompt": [0, 99999], "stream": True})
    assert r.status_code == 400
    assert r.headers["content-type"].startswith("application/json")
    assert r.json()["error"]["message"] == "Prompt contains invalid tokens"


def test_unknown_route_is_404_envelope(client):
    r = client.get("/no/such/route")
    assert r.status_code == 404
    assert r.json() == {"error": {"message": "File Not Found", "type": "not_found_error",
                                  "code": 404}}


def test_body_not_json_is_400(client):
    r = client.post("/completion", content=b"{not json")
    assert r.status_code == 400
    assert r.json()["error"]["type"] == "invalid_request_error"


def test_tokenize_roundtrip(client):
    tokens = client.post("/tokenize", json={"content": "def main():\n", "add_special": True}).json()
    assert tokens["tokens"][0] == 0
    text = client.post("/detokenize", json={"tokens": tokens["tokens"]}).json()["content"]
    assert text == "<s>def main():\n"


def test_health(client):
    assert client.get("/health").json() == {"status": "ok"}
    assert client.get("/v1/health").json() == {"status": "ok"}
