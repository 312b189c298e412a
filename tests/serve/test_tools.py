"""Tool calling over HTTP with the openai SDK: the embedded model served as `make serve` serves
it (configs/local.yaml: its chat template with Hermes-style tool calls), the README's agent
loop, and the request errors of the spec's test plan (T8)."""

from __future__ import annotations

import json
import re

import httpx
import openai
import pytest

from ..conftest import MODEL
from ..tool_models import CITIES, WEATHER, forced

LOCAL = {"model": MODEL, "chat_template_file": "models/tiny-python-tools.jinja",
         "n_parallel": 2, "n_ctx": 2048, "temperature": 0}
USER = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def local(deploy_app) -> str:
    return deploy_app("tools", LOCAL)


@pytest.fixture()
def sdk(local):
    with openai.OpenAI(base_url=local + "/v1", api_key="unused", max_retries=0) as c:
        yield c


def test_required_returns_a_real_call(sdk):
    out = sdk.chat.completions.create(model="tiny-python", messages=USER, tools=[CITIES],
                                      tool_choice="required", max_tokens=64,
                                      parallel_tool_calls=False)
    choice = out.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content == ""
    [call] = choice.message.tool_calls
    assert call.type == "function" and call.function.name == "get_weather"
    assert re.fullmatch(r"[0-9A-Za-z]{32}", call.id)
    arguments = json.loads(call.function.arguments)  # what the schema allows, the model's pick
    assert list(arguments) == ["city", "unit"]
    assert arguments["city"] in ("Paris", "Rome", "Tokyo")
    assert arguments["unit"] in ("celsius", "fahrenheit")


def test_stream_assembles_the_same_call(sdk):
    body = dict(model="tiny-python", messages=USER, tools=[forced(WEATHER, location="Paris")],
                tool_choice="required", max_tokens=64, parallel_tool_calls=False)
    chunks = list(sdk.chat.completions.create(**body, stream=True,
                                              stream_options={"include_usage": True}))
    calls = [c for ch in chunks if ch.choices for c in ch.choices[0].delta.tool_calls or []]
    assert calls[0].id and calls[0].function.name == "get_weather"
    assert all(c.id is None and c.function.name is None for c in calls[1:])
    arguments = "".join(c.function.arguments for c in calls)
    assert arguments == '{"location": "Paris"}'
    assert [ch.choices[0].finish_reason for ch in chunks if ch.choices][-1] == "tool_calls"
    assert chunks[-1].usage.completion_tokens > 0
    whole = sdk.chat.completions.create(**body)
    assert whole.choices[0].message.tool_calls[0].function.arguments == arguments


def test_agent_loop(sdk, local):
    """The README's loop: the model calls the tool, the tool's answer goes back, the model
    answers in text (tool_choice none: the tiny model would call again)."""
    tools = [forced(WEATHER, location="Paris")]
    messages = list(USER)
    first = sdk.chat.completions.create(model="tiny-python", messages=messages, tools=tools,
                                        tool_choice="required", max_tokens=64,
                                        parallel_tool_calls=False)
    call = first.choices[0].message.tool_calls[0]
    messages.append(first.choices[0].message.model_dump(exclude_none=True))
    messages.append({"role": "tool", "tool_call_id": call.id, "content": "sunny, 21 C"})
    second = sdk.chat.completions.create(model="tiny-python", messages=messages, tools=tools,
                                         tool_choice="none", max_tokens=8)
    assert second.choices[0].message.tool_calls is None
    assert second.choices[0].message.content and second.choices[0].finish_reason == "length"
    prompt = httpx.post(local + "/apply-template", timeout=60,
                        json={"messages": messages, "tools": tools}).json()["prompt"]
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"location": "Paris"}}' in prompt
    assert "<tool_response>\nsunny, 21 C\n</tool_response>" in prompt


def test_auto_arms_the_lazy_grammar(local):
    body = {"messages": USER, "tools": [WEATHER], "max_tokens": 4, "verbose": True}
    r = httpx.post(local + "/v1/chat/completions", json=body, timeout=60)
    settings = r.json()["__verbose"]["generation_settings"]
    assert settings["grammar_lazy"] is True
    assert settings["grammar_triggers"] == [{"type": 1, "value": "<tool_call>\n"}]
    assert settings["grammar"].startswith("%llguidance")
    assert r.json()["choices"][0]["finish_reason"] == "length"  # prose, no call


ERRORS = [
    ({"tool_choice": "bogus"}, 400, "Invalid tool_choice: bogus"),
    ({"tools": {}}, 500, "Failed to parse tools: Expected 'tools' to be an array"),
    ({"tools": [{"type": "code"}]}, 500, "Failed to parse tools: Unsupported tool type: "),
    ({"tools": [{"type": "function", "function": {"description": "x"}}]}, 500,
     "Failed to parse tools: [json.exception.out_of_range.403] key 'name' not found; tools = "),
    ({"chat_template_kwargs": {"enable_thinking": "no"}}, 400,
     'invalid type for "enable_thinking" (expected boolean, got string)'),
    ({"grammar": "root ::= \"x\""}, 400, "Cannot use custom grammar constraints with tools."),
    ({"logprobs": True, "stream": True}, 400, "logprobs is not supported with tools + stream"),
    ({"tool_choice": {"type": "function", "function": {"name": "nope"}}}, 400,
     "Invalid tool_choice: function 'nope' is not one of the tools"),
]


@pytest.mark.parametrize("extra, status, message", ERRORS)
def test_request_errors(local, extra, status, message):
    body = {"messages": USER, "tools": [WEATHER], "max_tokens": 2, **extra}
    r = httpx.post(local + "/v1/chat/completions", json=body, timeout=60)
    assert r.status_code == status
    error = r.json()["error"]
    assert error["message"].startswith(message)
    assert error["type"] == ("server_error" if status == 500 else "invalid_request_error")


def test_tool_schemas_as_the_reference_takes_them(local):
    """A keyword the grammar cannot enforce is left out (200, a warning in the log); a schema
    the reference refuses gets its 400 and text (tests/api/test_tool_schemas.py)."""
    def tool(parameters: dict) -> dict:
        return {"type": "function", "function": {"name": "t", "parameters": parameters}}

    loose = tool({"type": "object", "properties": {"tags": {
        "type": "object", "propertyNames": {"pattern": "^[a-z]+$"}}},
        "if": {"required": ["tags"]}, "then": {}, "unevaluatedProperties": False})
    body = {"messages": USER, "max_tokens": 24, "tool_choice": "required"}
    r = httpx.post(local + "/v1/chat/completions", json={**body, "tools": [loose]}, timeout=60)
    assert r.status_code == 200, r.text
    [call] = r.json()["choices"][0]["message"]["tool_calls"]
    assert call["function"]["name"] == "t"
    bad = tool({"type": "object", "properties": {"a": {"$ref": "#/$defs/missing"}}})
    r = httpx.post(local + "/v1/chat/completions", json={**body, "tools": [bad]}, timeout=60)
    assert r.status_code == 400
    assert r.json()["error"]["message"] == (
        "JSON schema conversion failed:\nError resolving ref #/$defs/missing: $defs not in "
        '{"type":"object","properties":{"a":{"$ref":"#/$defs/missing"}}}')
