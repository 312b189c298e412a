"""The newest official SDKs' helpers against the served graph (the tools app of test_tools.py:
the embedded model with its tool-calling template): openai's ``responses.stream()`` and
``.parse()``, ``chat.completions.stream()`` and ``.parse(response_format=<pydantic model>)``,
anthropic's ``messages.stream()`` with tools and with sampling fields in ``extra_body`` (the
SDK no longer takes them as arguments), checked on /slots to reach the sampler."""

from __future__ import annotations

import json
from typing import Literal

import anthropic
import httpx
import openai
import pytest
from pydantic import BaseModel

from ..tool_models import CITIES
from .test_tools import LOCAL, USER


class Weather(BaseModel):
    city: Literal["Paris", "Rome", "Tokyo"]
    unit: Literal["celsius", "fahrenheit"]


RESPONSES_TOOL = {"type": "function", **CITIES["function"]}
ANTHROPIC_TOOL = {"name": "get_weather", "description": "Get the weather in a city",
                  "input_schema": CITIES["function"]["parameters"]}


@pytest.fixture(scope="module")
def local(deploy_app) -> str:
    return deploy_app("tools", LOCAL)


@pytest.fixture()
def sdk(local):
    with openai.OpenAI(base_url=local + "/v1", api_key="unused", max_retries=0) as c:
        yield c


@pytest.fixture()
def claude(local):
    with anthropic.Anthropic(base_url=local, api_key="unused", max_retries=0) as c:
        yield c


def test_responses_stream_helper(sdk):
    """The accumulator needs sequence_number, output_index and content_index (mlxray's
    addition over the reference); the final response is the text the deltas made."""
    with sdk.responses.stream(model="tiny-python", input="hello", max_output_tokens=12) as s:
        events = list(s)
        final = s.get_final_response()
    assert [e.sequence_number for e in events] == list(range(len(events)))
    deltas = [e for e in events if e.type == "response.output_text.delta"]
    assert deltas and all(e.output_index == 0 and e.content_index == 0 for e in deltas)
    assert final.output_text == "".join(e.delta for e in deltas)
    assert final.status == "completed" and final.usage.output_tokens > 0


def test_responses_stream_helper_with_a_tool_call(sdk):
    with sdk.responses.stream(model="tiny-python", input="What is the weather in Paris?",
                              tools=[RESPONSES_TOOL], tool_choice="required",
                              max_output_tokens=64) as s:
        events = list(s)
        final = s.get_final_response()
    [call] = [item for item in final.output if item.type == "function_call"]
    arguments = json.loads(call.arguments)
    assert call.name == "get_weather" and Weather(**arguments)
    streamed = "".join(e.delta for e in events
                       if e.type == "response.function_call_arguments.delta")
    assert streamed == call.arguments


def test_responses_parse_with_a_pydantic_model(sdk):
    """``text.format`` (a json_schema) constrains the answer, so ``.parse()`` gets its model."""
    out = sdk.responses.parse(model="tiny-python", input="The weather in Rome?",
                              text_format=Weather, max_output_tokens=48)
    assert isinstance(out.output_parsed, Weather)
    assert out.output_parsed == Weather.model_validate_json(out.output_text)


def test_chat_completions_stream_helper(sdk):
    # a stop string ends it (the model writes "\nimport sys\n..." here); the helper refuses
    # a completion cut by max_tokens
    with sdk.chat.completions.stream(model="tiny-python", messages=USER, max_tokens=32,
                                     stop=["sys"]) as s:
        events = list(s)
        final = s.get_final_completion()
    text = "".join(e.delta for e in events if e.type == "content.delta")
    assert text and final.choices[0].message.content == text
    assert final.choices[0].finish_reason == "stop"


def test_chat_completions_stream_helper_with_a_tool_call(sdk):
    with sdk.chat.completions.stream(model="tiny-python", messages=USER,
                                     tools=[openai.pydantic_function_tool(
                                         Weather, name="get_weather")],
                                     tool_choice="required", parallel_tool_calls=False,
                                     max_tokens=64) as s:
        final = s.get_final_completion()
    [call] = final.choices[0].message.tool_calls
    assert isinstance(call.function.parsed_arguments, Weather)


def test_chat_completions_parse_with_a_pydantic_model(sdk):
    out = sdk.chat.completions.parse(model="tiny-python", messages=USER,
                                     response_format=Weather, max_tokens=48)
    parsed = out.choices[0].message.parsed
    assert isinstance(parsed, Weather)


def test_anthropic_messages_stream_with_tools(claude):
    choice = {"type": "any", "disable_parallel_tool_use": True}
    with claude.messages.stream(model="tiny-python", max_tokens=64,
                                messages=[{"role": "user", "content": "Weather in Tokyo?"}],
                                tools=[ANTHROPIC_TOOL], tool_choice=choice) as s:
        events = list(s)
        final = s.get_final_message()
    [block] = [b for b in final.content if b.type == "tool_use"]
    assert block.name == "get_weather" and Weather(**block.input)
    assert final.stop_reason == "tool_use"
    partial = "".join(e.partial_json for e in events if e.type == "input_json")
    assert json.loads(partial) == block.input


def test_anthropic_sampling_fields_in_extra_body_reach_the_sampler(claude, local):
    """The newest SDK takes no temperature/top_k/top_p arguments: clients send them in
    ``extra_body``; /slots shows them in the slot's sampling parameters."""
    sampling = {"temperature": 0.625, "top_k": 7, "top_p": 0.875}
    with claude.messages.stream(model="tiny-python", max_tokens=8, extra_body=sampling,
                                messages=[{"role": "user", "content": "hello"}]) as s:
        final = s.get_final_message()
    assert final.usage.output_tokens > 0
    slots = httpx.get(local + "/slots", timeout=30).json()
    seen = [{k: slot["params"][k] for k in sampling} for slot in slots]
    assert sampling in seen, seen
