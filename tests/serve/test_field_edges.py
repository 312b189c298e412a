"""Native /completion at its edges: probabilities before sampling, output that is not UTF-8 (a 500,
streamed or not), and the reasoning budget's limits and types."""

from __future__ import annotations

import pytest

from engine.types import BAD_OUTPUT_MESSAGE

from ..conftest import MODEL
from .test_fields import BASE, FIRST_GREEDY_TOKEN, GREEDY, sse_events


def test_pre_sampling_probs_ignore_logit_bias(client):
    body = {**GREEDY, **{k: BASE[k] for k in ("prompt", "cache_prompt")}, "n_predict": 1,
            "n_probs": 3}
    plain = client.post("/completion", json=body).json()["completion_probabilities"][0]
    banned = client.post("/completion", json={
        **body, "logit_bias": [[FIRST_GREEDY_TOKEN, False]], "repeat_penalty": 1.5,
    }).json()["completion_probabilities"][0]
    assert plain["id"] == FIRST_GREEDY_TOKEN and banned["id"] != FIRST_GREEDY_TOKEN
    assert banned["top_logprobs"] == plain["top_logprobs"]


@pytest.fixture(scope="module")
def lone_byte_token() -> int:
    from engine.model import load_model

    pieces = load_model(MODEL).vocab.pieces
    return pieces.index(b"\x80")


def test_invalid_utf8_output(client, lone_byte_token):
    body = {**BASE, "logit_bias": [[lone_byte_token, 100.0]], "n_predict": 2}
    r = client.post("/completion", json=body)
    assert r.status_code == 500
    assert r.json() == {"error": {"code": 500, "message": BAD_OUTPUT_MESSAGE,
                                  "type": "server_error"}}
    # a stream has started by then: the error is a frame, and the stream ends
    with client.stream("POST", "/completion", json={**body, "stream": True}) as r:
        assert r.status_code == 200
        events = sse_events(r.read().decode())
    assert events == [{"error": {"code": 500, "message": BAD_OUTPUT_MESSAGE,
                                 "type": "server_error"}}]


TYPE_302 = "[json.exception.type_error.302] type must be"


@pytest.mark.parametrize("body, message", [
    ({"reasoning_budget_tokens": -2}, "Field 'reasoning_budget_tokens': Value must be between -1 "
                                      "<= value <= 2147483647, but got -2"),
    ({"reasoning_budget_tokens": "3"}, f"Field 'reasoning_budget_tokens': {TYPE_302} number, "
                                       "but is string"),
    ({"reasoning_budget_start_tag": 5}, f"Field 'reasoning_budget_start_tag': {TYPE_302} "
                                        "string, but is number"),
    ({"reasoning_budget_end_tags": ["</x>", 1]}, f"Field 'reasoning_budget_end_tags': "
                                                 f"{TYPE_302} string, but is number"),
    ({"reasoning_budget_end_tag": ["</x>"]}, f"Field 'reasoning_budget_end_tag': {TYPE_302} "
                                             "string, but is array"),
    # a boolean in the reference's schema (it arms the budget sampler for the control route)
    ({"reasoning_control": {"enabled": False}}, f"Field 'reasoning_control': {TYPE_302} "
                                                "boolean, but is object"),
])
def test_reasoning_budget_limits_and_types(client, body, message):
    r = client.post("/completion", json={**BASE, **body})
    assert r.status_code == 400
    assert r.json()["error"] == {"code": 400, "message": message, "type": "invalid_request_error"}
