"""The Responses API and the Anthropic Messages API through the real graph, with the official
``openai`` and ``anthropic`` SDKs as clients: answers equal to the chat route's for the same
conversation, streams equal to non-stream answers, token counts, errors with the reference's
envelope and status, and random bodies that never get a 5xx."""

from __future__ import annotations

import json
import re

import anthropic
import httpx
import openai
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.types import BAD_OUTPUT_MESSAGE

from ..tool_models import WEATHER as WEATHER_TOOL
from ..tool_models import forced
from .test_http import sse_events
from .test_tools import LOCAL

HELLO = [{"role": "user", "content": "hello"}]
GREEDY = {"temperature": 0, "cache_prompt": False}
# the anthropic SDK has no temperature argument any more (2.14): the body field still works
ANTHROPIC_GREEDY = {"extra_body": {"temperature": 0}}


@pytest.fixture()
def oai(base_url):
    with openai.OpenAI(base_url=base_url + "/v1", api_key="unused", max_retries=0) as c:
        yield c


@pytest.fixture()
def claude(base_url):
    with anthropic.Anthropic(base_url=base_url, api_key="unused", max_retries=0) as c:
        yield c


def chat_text(client, messages: list[dict], max_tokens: int, **extra) -> dict:
    body = {"messages": messages, "max_tokens": max_tokens, **GREEDY, **extra}
    return client.post("/v1/chat/completions", json=body).json()["choices"][0]


def chat_tokens(client, messages: list[dict]) -> int:
    r = client.post("/v1/chat/completions/input_tokens", json={"messages": messages})
    return r.json()["input_tokens"]


# ---- Responses -----------------------------------------------------------------------------
def test_responses_text_is_the_chat_answer(oai, client):
    out = oai.responses.create(model="tiny-python", input="hello", instructions="python only",
                               max_output_tokens=8, temperature=0,
                               extra_body={"cache_prompt": False})
    messages = [{"role": "system", "content": "python only"}, *HELLO]
    assert out.output_text == chat_text(client, messages, 8)["message"]["content"]
    assert out.object == "response" and out.status == "completed"
    assert out.id.startswith("resp_") and out.output[0].id.startswith("msg_")
    assert out.usage.input_tokens == chat_tokens(client, messages)
    assert out.usage.output_tokens == 8
    assert out.usage.total_tokens == out.usage.input_tokens + 8


def test_responses_stream_equals_the_answer(oai):
    args = {"model": "tiny-python", "input": "hello", "max_output_tokens": 8, "temperature": 0,
            "extra_body": {"cache_prompt": False}}
    answer = oai.responses.create(**args)
    events = list(oai.responses.create(**args, stream=True))
    kinds = [e.type for e in events]
    assert kinds[:4] == ["response.created", "response.in_progress",
                         "response.output_item.added", "response.content_part.added"]
    assert kinds[4:-4] == ["response.output_text.delta"] * 8
    assert kinds[-4:] == ["response.output_text.done", "response.content_part.done",
                          "response.output_item.done", "response.completed"]
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == answer.output_text == events[-1].response.output_text
    message_ids = {e.item_id for e in events if hasattr(e, "item_id")}
    assert message_ids == {events[2].item.id}
    assert events[0].response.id == events[-1].response.id
    assert events[-1].response.usage == answer.usage


def test_responses_input_items_render_as_their_chat_messages(oai, client):
    """Messages, a function call and its output, reasoning: the prompt counted (and run) is the
    chat route's for the converted conversation."""
    items = [{"role": "user", "content": "hello"},
             {"type": "reasoning", "summary": [], "content": [{"type": "reasoning_text",
                                                               "text": "think"}]},
             {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
             {"type": "function_call_output", "call_id": "c1", "output": "42"},
             {"role": "user", "content": [{"type": "input_text", "text": "and?"}]}]
    messages = [HELLO[0],
                {"role": "assistant", "content": [], "reasoning_content": "think",
                 "tool_calls": [{"id": "c1", "type": "function",
                                 "function": {"name": "f", "arguments": "{}"}}]},
                {"role": "tool", "tool_call_id": "c1", "content": "42"},
                {"role": "user", "content": "and?"}]
    counted = oai.responses.input_tokens.count(model="tiny-python", input=items)
    assert counted.object == "response.input_tokens"
    assert counted.input_tokens == chat_tokens(client, messages) > chat_tokens(client, HELLO)
    out = oai.responses.create(model="tiny-python", input=items, max_output_tokens=6,
                               temperature=0, extra_body={"cache_prompt": False})
    assert out.output_text == chat_text(client, messages, 6)["message"]["content"]


def test_unprefixed_responses_routes(client):
    for path in ("/v1/responses/input_tokens", "/responses/input_tokens"):
        r = client.post(path, json={"input": "hello"})
        assert r.json() == {"input_tokens": 33, "object": "response.input_tokens"}
    assert client.post("/responses", json={"input": "hello", "max_output_tokens": 2,
                                           **GREEDY}).json()["usage"]["output_tokens"] == 2


@pytest.mark.parametrize(("body", "message"), [
    ({"input": "x", "previous_response_id": "resp_1"},
     "llama.cpp does not support 'previous_response_id'."),
    ({"max_output_tokens": 3}, "'input' is required"),
    ({"input": [{"type": "bogus"}]}, "Cannot determine type of 'item'"),
    ({"input": "x", "max_output_tokens": -5},
     "Field 'max_tokens': Value must be between -1 <= value <= 2147483647, but got -5"),
    ({"input": "x", "top_logprobs": 2}, "top_logprobs requires logprobs to be set to true"),
])
def test_responses_errors(oai, client, body, message):
    r = client.post("/v1/responses", json=body)
    assert r.status_code == 400
    assert r.json() == {"error": {"code": 400, "message": message,
                                  "type": "invalid_request_error"}}
    with pytest.raises(openai.BadRequestError, match="400"):
        oai.responses.create(model="tiny-python", **body)
    assert client.post("/v1/responses", json={**body, "stream": True}).json() == r.json()


def test_responses_stream_error_after_the_start(client, oai):
    """A stream that fails once its slot took it (the first token is not UTF-8, which
    llama-server's chat parser refuses) answers 200 and then ``data: {"error": ...}``, as the
    chat route; the openai SDK raises it."""
    emoji = client.post("/tokenize", json={"content": "\U0001F600"}).json()["tokens"]
    bias = {"logit_bias": [[emoji[1], 100]]}  # a lone continuation byte first
    body = {"input": "hello", "max_output_tokens": 4, **GREEDY}
    raw = client.post("/v1/responses", json={**body, **bias, "stream": True})
    assert raw.status_code == 200 and raw.headers["content-type"].startswith("text/event-stream")
    assert sse_events(raw.text) == [{"error": {"code": 500, "message": BAD_OUTPUT_MESSAGE,
                                               "type": "server_error"}}]
    with pytest.raises(openai.APIError, match="does not match"):
        list(oai.responses.create(model="tiny-python", stream=True, input="hello",
                                  max_output_tokens=4, temperature=0, extra_body=bias))


# ---- Messages ------------------------------------------------------------------------------
def test_messages_text_is_the_chat_answer(claude, client):
    out = claude.messages.create(model="tiny-python", max_tokens=8, messages=HELLO,
                                 system="python only", **ANTHROPIC_GREEDY)
    messages = [{"role": "system", "content": "python only"}, *HELLO]
    assert [b.type for b in out.content] == ["text"]
    assert out.content[0].text == chat_text(client, messages, 8)["message"]["content"]
    assert out.id.startswith("chatcmpl-") and out.role == "assistant"
    assert (out.stop_reason, out.stop_sequence) == ("max_tokens", None)
    assert out.usage.input_tokens + out.usage.cache_read_input_tokens == \
        chat_tokens(client, messages)
    assert out.usage.output_tokens == 8


def test_messages_stop_sequence_ends_the_turn(claude, client):
    out = claude.messages.create(model="tiny-python", max_tokens=16, messages=HELLO,
                                 stop_sequences=["sys"], **ANTHROPIC_GREEDY)
    expected = chat_text(client, HELLO, 16, stop=["sys"])
    assert expected["finish_reason"] == "stop"
    assert out.content[0].text == expected["message"]["content"]
    assert (out.stop_reason, out.stop_sequence) == ("end_turn", "sys")


def test_messages_stream_equals_the_answer(claude, base_url):
    args = {"model": "tiny-python", "max_tokens": 8, "messages": HELLO, **ANTHROPIC_GREEDY}
    answer = claude.messages.create(**args)
    with claude.messages.stream(**args) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == answer.content[0].text == final.content[0].text
    assert (final.stop_reason, final.stop_sequence) == ("max_tokens", None)
    assert final.usage.output_tokens == answer.usage.output_tokens
    assert final.usage.input_tokens + final.usage.cache_read_input_tokens == \
        answer.usage.input_tokens + answer.usage.cache_read_input_tokens
    kinds = [e.type for e in claude.messages.create(**args, stream=True)]
    assert kinds == ["message_start", "content_block_start", *["content_block_delta"] * 8,
                     "content_block_stop", "message_delta", "message_stop"]


def test_messages_count_tokens(claude, client):
    counted = claude.messages.count_tokens(model="tiny-python", system="python only",
                                           messages=HELLO)
    assert counted.input_tokens == chat_tokens(
        client, [{"role": "system", "content": "python only"}, *HELLO])
    assert client.post("/v1/messages/count_tokens", json={"messages": HELLO}).json() == \
        {"input_tokens": 33}


@pytest.mark.parametrize(("body", "message"), [
    ({"max_tokens": -5, "messages": HELLO},
     "Field 'max_tokens': Value must be between -1 <= value <= 2147483647, but got -5"),
    ({"max_tokens": 3}, "'messages' is required"),
    ({"max_tokens": 3, "messages": HELLO, "top_k": "many"},
     "Field 'top_k': [json.exception.type_error.302] type must be number, but is string"),
])
def test_messages_errors(claude, client, body, message):
    r = client.post("/v1/messages", json=body)
    assert r.status_code == 400
    assert r.json() == {"error": {"code": 400, "message": message,
                                  "type": "invalid_request_error"}}
    if "messages" in body:  # the SDK itself refuses a request without messages
        with pytest.raises(anthropic.BadRequestError) as raised:
            claude.messages.create(model="tiny-python", max_tokens=body["max_tokens"],
                                   messages=body["messages"], extra_body={
                                       k: v for k, v in body.items()
                                       if k not in ("max_tokens", "messages")})
        assert raised.value.status_code == 400 and raised.value.body == r.json()
    assert client.post("/v1/messages", json={**body, "stream": True}).json() == r.json()


@pytest.mark.parametrize("path", ["/v1/responses", "/responses", "/v1/responses/input_tokens",
                                  "/responses/input_tokens", "/v1/messages",
                                  "/v1/messages/count_tokens"])
def test_body_not_json_is_400(client, path):
    """As on every POST route: the client's mistake, a 400 (the reference answers 500)."""
    r = client.post(path, content=b"{not json")
    assert r.status_code == 400
    assert r.json()["error"]["message"].startswith("[json.exception.parse_error.101]")


# ---- tool calls: a forced call and its result fed back, on the tool-calling template --------
WEATHER = forced(WEATHER_TOOL, location="Paris")
QUESTION = "What is the weather in Paris?"


@pytest.fixture(scope="module")
def tools_app(deploy_app) -> str:
    return deploy_app("tools", LOCAL)  # `make serve`'s template (tests/serve/test_tools.py's app)


def test_responses_function_call_round_trip(tools_app):
    oai = openai.OpenAI(base_url=tools_app + "/v1", api_key="unused", max_retries=0)
    tool = {"type": "function", **WEATHER["function"]}  # the Responses API's flat form
    args = {"model": "tiny-python", "tools": [tool], "tool_choice": "required",
            "parallel_tool_calls": False, "max_output_tokens": 64}
    out = oai.responses.create(input=QUESTION, **args)
    [call] = out.output
    assert (call.type, call.name, call.status) == ("function_call", "get_weather", "completed")
    assert json.loads(call.arguments) == {"location": "Paris"}
    assert call.id == "fc_" + call.call_id.removeprefix("call_")
    events = list(oai.responses.create(input=QUESTION, stream=True, **args))
    added = [e.item for e in events if e.type == "response.output_item.added"]
    assert [(a.type, a.name, a.arguments) for a in added] == [("function_call", "get_weather", "")]
    deltas = [e for e in events if e.type == "response.function_call_arguments.delta"]
    assert {e.item_id for e in deltas} == {added[0].id}
    assert "".join(e.delta for e in deltas) == call.arguments
    assert events[-1].response.output[0].arguments == call.arguments
    # the conversion's strict: true is not rendered (the reference renders name, description
    # and parameters): the prompt is the chat route's
    counted = oai.responses.input_tokens.count(model="tiny-python", input=QUESTION, tools=[tool])
    chat_count = httpx.post(tools_app + "/v1/chat/completions/input_tokens", timeout=60, json={
        "messages": [{"role": "user", "content": QUESTION}], "tools": [WEATHER]}).json()
    assert counted.input_tokens == chat_count["input_tokens"]

    items = [{"role": "user", "content": QUESTION}, call.model_dump(exclude_none=True),
             {"type": "function_call_output", "call_id": call.call_id, "output": "sunny"}]
    answer = oai.responses.create(input=items, **{**args, "tool_choice": "none",
                                                  "max_output_tokens": 8})
    chat = [{"role": "user", "content": QUESTION},
            {"role": "assistant", "content": None, "tool_calls": [{
                "id": call.call_id, "type": "function",
                "function": {"name": "get_weather", "arguments": call.arguments}}]},
            {"role": "tool", "tool_call_id": call.call_id, "content": "sunny"}]
    expected = httpx.post(tools_app + "/v1/chat/completions", timeout=60, json={
        "messages": chat, "tools": [WEATHER], "tool_choice": "none", "max_tokens": 8}).json()
    assert answer.output_text == expected["choices"][0]["message"]["content"]


def test_messages_tool_use_round_trip(tools_app):
    claude = anthropic.Anthropic(base_url=tools_app, api_key="unused", max_retries=0)
    tool = {"name": "get_weather", "description": "Get weather",
            "input_schema": WEATHER["function"]["parameters"]}
    args = {"model": "tiny-python", "max_tokens": 64, "tools": [tool],
            "tool_choice": {"type": "tool", "name": "get_weather",
                            "disable_parallel_tool_use": True}}
    question = [{"role": "user", "content": QUESTION}]
    out = claude.messages.create(messages=question, **args)
    [use] = out.content
    assert (use.type, use.name, use.input) == ("tool_use", "get_weather", {"location": "Paris"})
    assert out.stop_reason == "tool_use" and re.fullmatch(r"[0-9A-Za-z]{32}", use.id)
    with claude.messages.stream(messages=question, **args) as stream:
        final = stream.get_final_message()
    assert [(b.type, b.name, b.input) for b in final.content] == \
        [("tool_use", "get_weather", {"location": "Paris"})]
    assert final.stop_reason == "tool_use"

    messages = [*question, {"role": "assistant", "content": out.content},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id,
                                              "content": "sunny"}]}]
    answer = claude.messages.create(messages=messages, **{**args, "max_tokens": 8,
                                                          "tool_choice": {"type": "none"}})
    chat = [*question,
            {"role": "assistant", "content": "", "tool_calls": [{
                "id": use.id, "type": "function",
                "function": {"name": "get_weather", "arguments": '{"location":"Paris"}'}}]},
            {"role": "tool", "tool_call_id": use.id, "content": "sunny"}]
    expected = httpx.post(tools_app + "/v1/chat/completions", timeout=60, json={
        "messages": chat, "tools": [WEATHER], "tool_choice": "none", "max_tokens": 8}).json()
    assert [b.type for b in answer.content] == ["text"]
    assert answer.content[0].text == expected["choices"][0]["message"]["content"]


# ---- random bodies: never a 5xx ------------------------------------------------------------
FUZZ = settings(max_examples=60, deadline=None, derandomize=True, database=None,
                suppress_health_check=list(HealthCheck))
scalars = st.none() | st.booleans() | st.integers(-3, 3) | st.text(max_size=8)
json_values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=3)
                           | st.dictionaries(st.text(max_size=6), inner, max_size=3), max_leaves=6)
texts = st.text(max_size=12) | json_values
parts = st.fixed_dictionaries({"type": st.sampled_from(
    ["input_text", "output_text", "text", "refusal", "input_image", "input_file", "x"])},
    optional={"text": texts, "refusal": texts, "image_url": texts})
items = st.one_of(
    st.fixed_dictionaries(
        {"role": st.sampled_from(["user", "system", "developer", "assistant"]) | json_values},
        optional={"type": st.just("message"), "content": texts | st.lists(parts, max_size=2)}),
    st.fixed_dictionaries({"type": st.just("function_call"), "call_id": texts, "name": texts,
                           "arguments": texts}),
    st.fixed_dictionaries({"type": st.just("function_call_output"), "call_id": texts,
                           "output": texts | st.lists(parts, max_size=2)}),
    st.fixed_dictionaries({"type": st.just("reasoning"), "summary": json_values},
                          optional={"content": json_values}),
    json_values)
responses_bodies = st.fixed_dictionaries(
    {"input": st.text(max_size=12) | st.lists(items, max_size=3) | json_values},
    optional={"instructions": texts, "tools": json_values, "tool_choice": json_values,
              "max_output_tokens": json_values, "previous_response_id": texts,
              "reasoning": json_values, "stream": st.booleans()})
blocks = st.fixed_dictionaries({"type": st.sampled_from(
    ["text", "thinking", "tool_use", "tool_result", "image", "x"])},
    optional={"text": texts, "thinking": texts, "id": texts, "name": texts, "input": json_values,
              "tool_use_id": texts, "content": texts, "source": json_values})
well_formed = st.one_of(
    st.fixed_dictionaries({"type": st.just("text"), "text": st.text(max_size=12)}),
    st.fixed_dictionaries({"type": st.just("thinking"), "thinking": st.text(max_size=12)}),
    st.fixed_dictionaries({"type": st.just("tool_use"), "id": st.text(max_size=4),
                           "name": st.text(max_size=4), "input": json_values}),
    st.fixed_dictionaries({"type": st.just("tool_result"), "tool_use_id": st.text(max_size=4),
                           "content": texts}))
anthropic_messages = st.fixed_dictionaries(
    {"role": st.sampled_from(["user", "assistant"]),
     "content": st.text(max_size=12) | st.lists(well_formed | blocks, min_size=1, max_size=3)})
messages_bodies = st.fixed_dictionaries(
    {"messages": st.lists(anthropic_messages, min_size=1, max_size=3)
     | st.lists(anthropic_messages | json_values, max_size=2) | json_values},
    optional={"system": texts | st.lists(blocks, max_size=2), "max_tokens": json_values,
              "stop_sequences": json_values, "tools": json_values, "tool_choice": json_values,
              "temperature": json_values, "top_k": json_values, "thinking": json_values,
              "stream": st.booleans()})


# the reference's own 500s: malformed tools, and output its chat parser refuses
REFERENCE_500S = ("Failed to parse tools: ", BAD_OUTPUT_MESSAGE)


def check_no_5xx(client, path: str, body: dict) -> None:
    """No 5xx but the reference's own, the envelope on every error; a stream's frames parse."""
    r = client.post(path, content=json.dumps(body))
    if r.status_code != 200:
        error = r.json()["error"]
        assert error["code"] == r.status_code
        assert r.status_code < 500 or error["message"].startswith(REFERENCE_500S), r.text[:300]
    elif r.headers["content-type"].startswith("text/event-stream"):
        events = sse_events(r.text)
        assert events and all("type" in e or "error" in e for e in events)


@FUZZ
@given(body=responses_bodies)
def test_random_responses_bodies(client, body):
    check_no_5xx(client, "/v1/responses", {**body, "n_predict": 2, "cache_prompt": False})


@FUZZ
@given(body=messages_bodies, max_tokens=st.sampled_from([1, 2, -5, "x", 2.5]))
def test_random_messages_bodies(client, body, max_tokens):
    check_no_5xx(client, "/v1/messages", {**body, "max_tokens": max_tokens})
