"""``POST /v1/chat/completions/control`` through the real graph: ``reasoning_end`` spends a running
completion's reasoning budget at once (its message and end tag come next, on real output), with
the reference's answers for an unknown id, a completion without ``reasoning_control``, a missing
id and an unknown action."""

from __future__ import annotations

import asyncio
import json

import httpx

# " return" opens the budget; the tiny model never writes "</think>", so without control the
# budget (unlimited: reasoning_control arms it) never ends
ARMED = {"prompt": "def main():\n", "max_tokens": 300, "stream": True, "temperature": 0,
         "cache_prompt": False, "ignore_eos": True, "reasoning_budget_start_tag": " return",
         "reasoning_budget_end_tags": ["</think>"], "reasoning_budget_message": " None",
         "reasoning_control": True}


def texts(raw: str) -> list[str]:
    chunks = [json.loads(line[6:]) for line in raw.splitlines()
              if line.startswith("data: ") and line != "data: [DONE]"]
    return [c["choices"][0]["text"] for c in chunks if c.get("choices")]


async def ended_mid_stream(base_url: str, body: dict) -> tuple[dict, str]:
    """Stream ``body``; after a few tokens, ask to end its reasoning; the answer and the text."""
    async with httpx.AsyncClient(base_url=base_url, timeout=120) as ac:
        async with ac.stream("POST", "/v1/completions", json=body) as r:
            lines = r.aiter_lines()
            seen, raw, answer = 0, "", None
            async for line in lines:
                raw += line + "\n"
                if line.startswith("data: {") and answer is None:
                    seen += 1
                    if seen == 4:  # past " return": the budget is counting
                        cmpl_id = json.loads(line[6:])["id"]
                        answer = (await ac.post("/v1/chat/completions/control", json={
                            "id": cmpl_id, "action": "reasoning_end"})).json()
    return answer, "".join(texts(raw))


def test_reasoning_end_forces_the_budget_end(base_url, client):
    plain = client.post("/v1/completions", json={**ARMED, "stream": False}).json()
    assert "</think>" not in plain["choices"][0]["text"]
    answer, text = asyncio.run(ended_mid_stream(base_url, ARMED))
    assert answer == {"success": True}
    assert " None</think>" in text and text != plain["choices"][0]["text"]
    cut = text.index(" None</think>")
    assert plain["choices"][0]["text"].startswith(text[:cut])  # the same output up to the force


def test_reference_answers(base_url, client):
    post = lambda body: client.post("/v1/chat/completions/control", json=body)  # noqa: E731
    assert post({"id": "chatcmpl-none", "action": "reasoning_end"}).json() == {
        "success": False, "message": "no active completion for this id"}
    unarmed = {**ARMED, "reasoning_control": False, "reasoning_budget_tokens": -1}
    answer, _ = asyncio.run(ended_mid_stream(base_url, unarmed))
    assert answer == {"success": False,
                      "message": "reasoning control not enabled for this completion"}
    for body, message in (({"action": "reasoning_end"}, "missing completion id"),
                          ({"id": 5, "action": "reasoning_end"}, "missing completion id"),
                          ([1], "missing completion id"),
                          ({"id": "x", "action": "pause"}, "unknown control action"),
                          ({"id": "x"}, "unknown control action")):
        r = post(body)
        assert r.status_code == 400
        assert r.json() == {"error": {"code": 400, "message": message,
                                      "type": "invalid_request_error"}}
