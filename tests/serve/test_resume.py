"""Resumable streams through the real graph, as the reference serves them (server-stream.cpp): a
stream sent with X-Conversation-Id is kept, replayed from any offset, outlives a dropped client,
is looked up by id and stopped by DELETE; the reference's errors. The session store's own rules
(cap, TTL, replacement, offsets): tests/api/test_stream_sessions.py."""

from __future__ import annotations

import asyncio
import json
import time
import uuid

import httpx

GREEDY = {"temperature": 0, "cache_prompt": False}
SHORT = {"prompt": "def main():\n", "n_predict": 8, "stream": True, **GREEDY}
LONG = {"prompt": "def main():\n", "n_predict": 300, "ignore_eos": True, "stream": True, **GREEDY}


def conversation() -> str:
    return f"conv-{uuid.uuid4().hex[:12]}"


def events(raw: bytes) -> list:
    return [json.loads(line[6:]) for line in raw.decode().splitlines()
            if line.startswith("data: ") and line != "data: [DONE]"]


def streamed(client: httpx.Client, conv: str, body: dict, path: str = "/completion") -> bytes:
    with client.stream("POST", path, json=body, headers={"X-Conversation-Id": conv}) as r:
        assert r.status_code == 200
        return r.read()


def replay(client: httpx.Client, conv: str, offset: int | None = None) -> httpx.Response:
    query = f"?conv_id={conv}" + ("" if offset is None else f"&from={offset}")
    return client.get("/v1/stream" + query)


def idle(client: httpx.Client) -> bool:
    return not any(s["is_processing"] for s in client.get("/slots").json())


def wait_until(condition, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)


def test_a_kept_stream_replays_byte_for_byte(client):
    conv = conversation()
    live = streamed(client, conv, SHORT)
    assert events(live)[-1]["stop"] is True
    r = replay(client, conv)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    assert r.content == live
    assert replay(client, conv, 10).content == live[10:]
    assert replay(client, conv, len(live)).content == b""
    # the OpenAI chat stream too, [DONE] included
    chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "stream": True,
            **GREEDY}
    live = streamed(client, conv, chat, "/v1/chat/completions")  # replaces the first session
    assert live.endswith(b"data: [DONE]\n\n") and replay(client, conv).content == live


def test_a_dropped_client_resumes_from_its_offset(base_url, client):
    conv = conversation()

    async def drop_after_first_frame() -> bytes:
        async with httpx.AsyncClient(base_url=base_url, timeout=120) as ac:
            async with ac.stream("POST", "/completion", json=LONG,
                                 headers={"X-Conversation-Id": conv}) as r:
                async for chunk in r.aiter_raw():
                    return chunk  # the connection closes here, mid-generation
        raise AssertionError("no frame")

    got = asyncio.run(drop_after_first_frame())
    rest = replay(client, conv, len(got))  # follows the live generation to its end
    assert rest.status_code == 200
    frames = events(got + rest.content)
    assert frames[-1]["stop"] is True and frames[-1]["tokens_predicted"] == 300
    assert sum(1 for f in frames if not f["stop"]) == 300  # every token once, none lost
    assert replay(client, conv).content == got + rest.content
    wait_until(lambda: idle(client))


def test_delete_stops_the_generation_and_forgets_the_stream(base_url, client):
    conv = conversation()

    async def delete_mid_stream() -> tuple[int, bytes]:
        async with httpx.AsyncClient(base_url=base_url, timeout=120) as ac:
            async with ac.stream("POST", "/completion", json=LONG,
                                 headers={"X-Conversation-Id": conv}) as r:
                stream = r.aiter_raw()
                first = await anext(stream)
                stopped = await ac.delete(f"/v1/stream?conv_id={conv}")
                rest = b"".join([c async for c in stream])
        return stopped.status_code, first + rest

    status, body = asyncio.run(delete_mid_stream())
    assert status == 204
    assert len([f for f in events(body) if not f["stop"]]) < 300  # cut short
    wait_until(lambda: idle(client), timeout=10)  # the slot is freed
    gone = replay(client, conv)
    assert gone.status_code == 404
    assert gone.json() == {"error": {"code": 404, "message": "Stream not found or expired",
                                     "type": "not_found_error"}}
    assert client.delete(f"/v1/stream?conv_id={conv}").status_code == 204  # idempotent


def test_lookup_answers_for_the_ids_asked(client):
    conv = conversation()
    live = streamed(client, conv, SHORT)
    found = client.post("/v1/streams/lookup", json={"conversation_ids": [conv, "", 5, "none"]})
    assert found.status_code == 200
    [info] = found.json()
    assert list(info) == ["conversation_id", "is_done", "total_bytes", "started_at",
                          "completed_at"]
    assert (info["conversation_id"], info["is_done"], info["total_bytes"]) == (
        conv, True, len(live))
    assert 0 < info["started_at"] <= info["completed_at"] <= time.time() + 1
    assert client.post("/v1/streams/lookup", json={}).json() == []
    bad = client.post("/v1/streams/lookup", content=b"{nope")
    assert bad.status_code == 400
    error = bad.json()["error"]
    assert list(error) == ["message", "type"] and error["type"] == "invalid_request_error"
    assert error["message"].startswith("invalid body: [json.exception.parse_error.101]")


def test_reference_errors(client):
    missing = {"error": {"code": 400, "message": "Missing conversation id in path",
                         "type": "invalid_request_error"}}
    assert client.get("/v1/stream").json() == missing
    assert client.delete("/v1/stream").json() == missing
    conv = conversation()
    streamed(client, conv, SHORT)
    bad = replay(client, conv, None)
    assert bad.status_code == 200
    r = client.get(f"/v1/stream?conv_id={conv}&from=x1")
    assert r.status_code == 400 and r.json()["error"]["message"] == "Invalid 'from' offset"


def test_a_refused_stream_leaves_no_session(client):
    conv = conversation()
    r = client.post("/completion", json={**SHORT, "prompt": "x " * 5000},
                    headers={"X-Conversation-Id": conv})
    assert r.status_code == 400 and r.headers["content-type"].startswith("application/json")
    assert client.post("/v1/streams/lookup", json={"conversation_ids": [conv]}).json() == []
