"""The Python handle API (README "From Python"): ``handle = serve.run(build_app(config))``, a
completion as the native dict, a stream of native frames, errors as ``RequestError`` carrying the
envelope the same request gets over HTTP."""

from __future__ import annotations

import pytest

from tests.conftest import CONFORMANCE_ARGS

DEF_MAIN = {"prompt": "def main():\n", "n_predict": 16, "temperature": 0, "cache_prompt": False}


@pytest.fixture(scope="module")
def handle(serve_instance):
    """The README's example: its own app (no HTTP route), on the session's Ray Serve."""
    from ray import serve

    from deployments.serve.graph import build_app

    handle = serve.run(build_app(CONFORMANCE_ARGS), name="handle_api", route_prefix=None)
    yield handle
    serve.delete("handle_api")


def test_completion_is_the_native_dict(handle, client):
    result = handle.complete.remote(DEF_MAIN).result()
    over_http = client.post("/completion", json=DEF_MAIN).json()
    assert result["content"] == '    return codecs.CodecInfo(\n    "C'
    assert list(result) == list(over_http)
    volatile = {"timings", "id_slot"}  # measured; the slot the scheduler picked
    assert {k: v for k, v in result.items() if k not in volatile} == \
        {k: v for k, v in over_http.items() if k not in volatile}


def test_several_prompts_give_a_list(handle):
    result = handle.complete.remote({**DEF_MAIN, "prompt": ["x = 1\n", "import os\n"],
                                     "n_predict": 2}).result()
    assert [r["index"] for r in result] == [0, 1]


def test_stream_yields_the_native_frames(handle):
    frames = list(handle.options(stream=True).stream.remote({**DEF_MAIN, "n_predict": 5}))
    assert [f["stop"] for f in frames] == [False] * 5 + [True]
    assert "".join(f["content"] for f in frames) == "    return codecs"
    assert frames[-1]["stop_type"] == "limit"


@pytest.mark.parametrize("body", [
    {"n_predict": 4},                                         # no prompt
    {"prompt": [], "n_predict": 4},                           # empty prompt
    {"prompt": "x", "stream": "yes"},                         # wrong type
    {"prompt": "x", "n_cmpl": 5},                             # more than the slots
    {"prompt": "x = 1\n" * 1000},                             # longer than the context
])
def test_errors_carry_the_http_envelope(handle, client, body):
    from deployments.api.errors import RequestError

    over_http = client.post("/completion", json=body)
    with pytest.raises(RequestError) as raised:
        handle.complete.remote(body).result()
    assert raised.value.status == over_http.status_code
    assert raised.value.envelope == over_http.json()
    with pytest.raises(RequestError) as raised:
        list(handle.options(stream=True).stream.remote(body))
    assert raised.value.envelope == over_http.json()


def test_stream_flag_must_match_the_method(handle):
    from deployments.api.errors import RequestError

    with pytest.raises(RequestError, match="handle.options"):
        handle.complete.remote({**DEF_MAIN, "stream": True}).result()
    with pytest.raises(RequestError, match="handle.complete"):
        list(handle.options(stream=True).stream.remote({**DEF_MAIN, "stream": False}))


RESPONSES = {"input": "hello", "max_output_tokens": 6, "temperature": 0, "cache_prompt": False}
MESSAGES = {"messages": [{"role": "user", "content": "hello"}], "max_tokens": 6,
            "temperature": 0}


def test_responses_and_messages_entry_points(handle, client):
    """handle.responses / responses_stream and handle.messages / messages_stream: the protocol's
    answer and stream events as dicts, equal to what HTTP answers."""
    result = handle.responses.remote(RESPONSES).result()
    over_http = client.post("/v1/responses", json=RESPONSES).json()
    assert list(result) == list(over_http) and result["output"][0]["content"] == \
        over_http["output"][0]["content"]
    events = list(handle.options(stream=True).responses_stream.remote(RESPONSES))
    assert events[0]["type"] == "response.created"
    assert events[-1]["response"]["output"][0]["content"] == result["output"][0]["content"]

    result = handle.messages.remote(MESSAGES).result()
    over_http = client.post("/v1/messages", json=MESSAGES).json()
    assert list(result) == list(over_http) and result["content"] == over_http["content"]
    events = list(handle.options(stream=True).messages_stream.remote(MESSAGES))
    assert [e["type"] for e in events[:2]] == ["message_start", "content_block_start"]
    text = "".join(e["delta"]["text"] for e in events if e["type"] == "content_block_delta")
    assert text == result["content"][0]["text"]


@pytest.mark.parametrize(("method", "path", "body"), [
    ("responses", "/v1/responses", {**RESPONSES, "previous_response_id": "resp_1"}),
    ("messages", "/v1/messages", {**MESSAGES, "max_tokens": -5}),
])
def test_protocol_errors_carry_the_http_envelope(handle, client, method, path, body):
    from deployments.api.errors import RequestError

    over_http = client.post(path, json=body)
    with pytest.raises(RequestError) as raised:
        getattr(handle, method).remote(body).result()
    assert (raised.value.status, raised.value.envelope) == (400, over_http.json())
    with pytest.raises(RequestError) as raised:
        list(getattr(handle.options(stream=True), method + "_stream").remote(body))
    assert raised.value.envelope == over_http.json()
