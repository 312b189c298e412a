"""The request conversions of the Responses and Messages APIs onto the chat-completions body
(deployments/api/protocols/), checked against what llama-server b10621's server-chat.cpp builds for
the same requests; and the Messages stream's error event as the anthropic SDK reads it. No Ray:
these are plain functions (the routes are tested through the graph in
tests/serve/test_protocols.py)."""

from __future__ import annotations

import anthropic
import httpx
import pytest

from deployments.api.errors import ApiError
from deployments.api.framing import dumps
from deployments.api.protocols import messages, responses, to_chat

try:  # the anthropic SDK moved to httpx2 (2.14); earlier versions take httpx objects
    import httpx2 as sdk_httpx
except ImportError:  # pragma: no cover
    sdk_httpx = httpx


def refused(protocol: str, body) -> str:
    with pytest.raises(ApiError) as raised:
        to_chat(protocol, body)
    assert raised.value.code == 400 and raised.value.type == "invalid_request_error"
    return raised.value.message


# ---- Responses -----------------------------------------------------------------------------
def test_responses_string_input_and_renamed_fields():
    body = {"model": "m", "input": "hi", "instructions": "be brief", "max_output_tokens": 5,
            "reasoning": {"effort": "low", "summary": "auto"}, "temperature": 0, "seed": 3,
            "stream": True, "tools": [{"type": "function", "name": "f", "parameters": {}},
                                      {"type": "web_search"}]}
    assert responses.to_chat(body) == {
        "model": "m", "temperature": 0, "seed": 3, "stream": True,  # the rest passes through
        "messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}],
        "tools": [{"type": "function", "function": {"name": "f", "parameters": {},
                                                    "strict": True}}],
        "max_tokens": 5, "reasoning_effort": "low"}


def test_responses_items_become_chat_messages():
    items = [
        {"role": "developer", "content": "rules"},
        {"type": "message", "role": "user", "status": "completed",
         "content": [{"type": "input_text", "text": "a"}, {"type": "input_text", "text": "b"}]},
        {"type": "reasoning", "summary": [], "content": [{"type": "reasoning_text", "text": "r"}]},
        {"type": "message", "role": "assistant", "id": "msg_1", "status": "completed",
         "content": [{"type": "output_text", "text": "calling", "annotations": []}]},
        {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{\"x\":1}"},
        {"type": "function_call_output", "call_id": "c1", "output": "42"},
        {"type": "function_call_output", "call_id": "c2",
         "output": [{"type": "input_text", "text": "43"}]},
        {"type": "function_call", "call_id": "c3", "name": "g", "arguments": "{}"},
        {"type": "message", "role": "assistant", "content": "done"},
    ]
    chat = responses.to_chat({"input": items})
    assert chat["messages"] == [
        {"role": "developer", "content": [{"text": "rules", "type": "text"}]},
        {"role": "user", "content": [{"text": "a", "type": "text"}, {"text": "b", "type": "text"}]},
        # reasoning opens an assistant message; the message and the call after it merge into it
        {"role": "assistant", "content": [{"text": "calling", "type": "text"}],
         "reasoning_content": "r",
         "tool_calls": [{"function": {"arguments": "{\"x\":1}", "name": "f"}, "id": "c1",
                         "type": "function"}]},
        {"content": "42", "role": "tool", "tool_call_id": "c1"},
        {"content": [{"type": "text", "text": "43"}], "role": "tool", "tool_call_id": "c2"},
        {"role": "assistant", "tool_calls": [{"function": {"arguments": "{}", "name": "g"},
                                              "id": "c3", "type": "function"}],
         "content": [{"text": "done", "type": "text"}]},
    ]


def test_responses_named_tool_choice_takes_the_chat_form():
    chat = responses.to_chat({"input": "x", "tool_choice": {"type": "function", "name": "f"}})
    assert chat["tool_choice"] == {"type": "function", "function": {"name": "f"}}
    assert responses.to_chat({"input": "x", "tool_choice": "required"})["tool_choice"] == \
        "required"


@pytest.mark.parametrize(("body", "message"), [
    ({"model": "m"}, "'input' is required"),
    ([], "'input' is required"),
    ({"input": "x", "previous_response_id": "resp_1"},
     "llama.cpp does not support 'previous_response_id'."),
    ({"input": 5}, "'input' must be a string or array of objects"),
    ({"input": [5]}, "Cannot determine type of 'item'"),
    ({"input": [{"role": "assistant", "content": "x"}]}, "Cannot determine type of 'item'"),
    ({"input": [{"role": "user", "content": [{"type": "input_text"}]}]},
     "'Input text' requires 'text'"),
    ({"input": [{"role": "user", "content": [{"type": "input_image"}]}]},
     "'image_url' is required"),
    ({"input": [{"role": "user", "content": [{"type": "input_file"}]}]},
     "'input_file' is not supported by llamacpp at this moment"),
    ({"input": [{"role": "user", "content": [{"type": "x"}]}]},
     "'type' must be one of 'input_text', 'input_image', or 'input_file'"),
    ({"input": [{"type": "message", "role": "assistant", "content": [{"type": "output_text"}]}]},
     "'Output text' requires 'text'"),
    ({"input": [{"type": "message", "role": "assistant", "content": [{"type": "x"}]}]},
     "'type' must be one of 'output_text' or 'refusal'"),
    ({"input": [{"type": "function_call_output", "call_id": "c", "output": [{"type": "x"}]}]},
     "Output of tool call should be 'Input text'"),
    ({"input": [{"type": "reasoning", "summary": [], "content": []}]}, "item['content'] is empty"),
    ({"input": [{"type": "reasoning", "summary": []}]}, "item['content'] is not an array"),
    ({"input": [{"type": "reasoning", "summary": [], "content": [{}]}]},
     "item['content']['text'] is not a string"),
    ({"input": "x", "tools": {}}, "'tools' must be an array of objects"),
])
def test_responses_refusals(body, message):
    assert refused("responses", body) == message


# ---- Messages ------------------------------------------------------------------------------
def test_messages_blocks_become_chat_messages():
    body = {
        "model": "m", "max_tokens": 9, "system": [{"type": "text", "text": "be "},
                                                   {"type": "text", "text": "brief"}],
        "messages": [
            {"role": "user", "content": "weather?"},
            {"role": "assistant", "content": [
                {"type": "thinking", "thinking": "use the tool", "signature": ""},
                {"type": "text", "text": "checking"},
                {"type": "tool_use", "id": "toolu_1", "name": "get", "input": {"city": "Oslo"}}]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1",
                 "content": [{"type": "text", "text": "-3"}, {"type": "text", "text": " C"}]},
                {"type": "text", "text": "and tomorrow?"}]},
            {"role": "assistant"},  # no content: dropped
        ],
        "tools": [{"name": "get", "description": "weather", "input_schema": {"type": "object"}}],
        "tool_choice": {"type": "tool", "name": "get"}, "stop_sequences": ["\n\n"],
        "temperature": 0, "top_k": 5, "stream": False, "cache_prompt": False,
        "thinking": {"type": "enabled", "budget_tokens": 64}, "metadata": {"user_id": "u"},
    }
    assert messages.to_chat(body) == {
        "messages": [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": "weather?"},
            {"role": "assistant", "content": [{"type": "text", "text": "checking"}],
             "tool_calls": [{"id": "toolu_1", "type": "function", "function": {
                 "name": "get", "arguments": "{\"city\":\"Oslo\"}"}}],
             "reasoning_content": "use the tool"},
            {"role": "user", "content": [{"type": "text", "text": "and tomorrow?"}]},
            {"role": "tool", "tool_call_id": "toolu_1", "content": "-3 C"},
        ],
        "tools": [{"type": "function", "function": {"name": "get", "description": "weather",
                                                    "parameters": {"type": "object"}}}],
        "tool_choice": {"type": "function", "function": {"name": "get"}},
        "stop": ["\n\n"], "max_tokens": 9, "temperature": 0, "top_k": 5, "stream": False,
        "thinking_budget_tokens": 64, "__metadata_user_id": "u",
    }  # fields the Messages API does not define (cache_prompt) are not passed on


@pytest.mark.parametrize(("choice", "chat"), [
    ({"type": "auto"}, "auto"), ({"type": "any"}, "required"), ({"type": "none"}, "none"),
    ("auto", None),  # not an object: no tool_choice, as in the reference
])
def test_messages_tool_choice(choice, chat):
    assert messages.to_chat({"messages": [], "tool_choice": choice}).get("tool_choice") == chat


def test_messages_disable_parallel_tool_use():
    out = messages.to_chat({"messages": [], "tool_choice": {"type": "any",
                                                           "disable_parallel_tool_use": True}})
    assert out["parallel_tool_calls"] is False
    assert "parallel_tool_calls" not in messages.to_chat({"messages": [],
                                                           "tool_choice": {"type": "any"}})


def test_messages_defaults_and_the_billing_stamp():
    out = messages.to_chat({"messages": [{"role": "user", "content": "x"}], "system":
                            "x-anthropic-billing-header: cc_version=2; cch=a5145;You are Claude."})
    assert out["max_tokens"] == 4096
    assert out["messages"][0]["content"] == \
        "x-anthropic-billing-header: cc_version=2; cch=fffff;You are Claude."
    tool_result = {"type": "tool_result", "tool_use_id": "t", "content": [
        {"type": "text", "text": "see"}, {"type": "image", "source": {"type": "url", "url": "u"}}]}
    out = messages.to_chat({"messages": [{"role": "user", "content": [tool_result]}],
                            "thinking": {"type": "enabled"}})
    assert out["messages"] == [{"role": "tool", "tool_call_id": "t", "content": [
        {"type": "text", "text": "see"}, {"type": "image_url", "image_url": {"url": "u"}}]}]
    assert out["thinking_budget_tokens"] == 10000


def test_messages_refusal():
    assert refused("messages", {"max_tokens": 3}) == "'messages' is required"
    assert refused("messages", "x") == "'messages' is required"


def test_messages_stream_error_is_an_error_event_the_sdk_raises():
    """A Messages stream that fails after it started ends with ``event: error`` carrying the
    error object (the reference's format_anthropic_sse); the anthropic SDK raises it."""
    shape = messages.MessagesShape.__new__(messages.MessagesShape)
    error = ApiError("The model produced output that does not match the expected format",
                     "server_error")
    frame = shape.encode_error(error.body())
    assert frame == b"event: error\ndata: " + dumps(error.body()["error"]) + b"\n\n"
    start = shape.encode({"type": "message_stop"})
    assert start == b'event: message_stop\ndata: {"type":"message_stop"}\n\n'

    def answer(request):
        return sdk_httpx.Response(200, headers={"content-type": "text/event-stream"},
                                  content=start + frame)

    transport = sdk_httpx.MockTransport(answer)
    client = anthropic.Anthropic(api_key="x", base_url="http://test", max_retries=0,
                                 http_client=sdk_httpx.Client(transport=transport))
    stream = client.messages.create(model="m", max_tokens=1, stream=True,
                                    messages=[{"role": "user", "content": "x"}])
    with pytest.raises(anthropic.APIStatusError, match="does not match"):
        list(stream)


# ---- answers: reasoning, text and a tool call, as the chat path sends them ------------------
def chunk(delta: dict, finish: str | None = None) -> dict:
    return {"choices": [{"finish_reason": finish, "index": 0, "delta": delta}], "created": 1,
            "id": "chatcmpl-x", "model": "m", "system_fingerprint": "b", "object": "c"}


# the chat stream of spec §9 T3 (a Qwen3 template): the chunks each token brings
CALL = {"index": 0, "id": "abc", "type": "function",
        "function": {"name": "get_weather", "arguments": "{"}}
T3_TOKENS = [
    [chunk({"role": "assistant", "content": None}), chunk({"reasoning_content": "User wants"})],
    [chunk({"reasoning_content": " weather.\n"}), chunk({"content": "Checking."})],
    [chunk({"content": "\n"}), chunk({"tool_calls": [CALL]})],
    [chunk({"tool_calls": [{"index": 0, "function": {"arguments": '"location": "Paris"}'}}]})],
]
T3_FINAL = [{**chunk({}, "tool_calls"), "timings": {"predicted_n": 4}}]
T3_ANSWER = {"choices": [{"finish_reason": "tool_calls", "index": 0, "message": {
    "role": "assistant", "content": "Checking.\n", "reasoning_content": "User wants weather.\n",
    "tool_calls": [{"type": "function", "function": {
        "name": "get_weather", "arguments": '{"location": "Paris"}'}, "id": "abc"}]}}],
    "id": "chatcmpl-x", "usage": {"completion_tokens": 4, "prompt_tokens": 30, "total_tokens": 34,
                                  "prompt_tokens_details": {"cached_tokens": 10}}}


class T3Chat:
    """What the chat shape answers for T3's tokens (the input of the conversions)."""

    def __init__(self):
        from deployments.api.shapes import OaiContext

        self.ctx = OaiContext("chat.completion", "chatcmpl-x", 1, "m", "b")
        self.tokens = iter(T3_TOKENS)

    def token(self, ev):
        return next(self.tokens)

    def final(self, ev, stream):
        return T3_FINAL if stream else [T3_ANSWER]


def t3_events(shape_class) -> tuple[list[dict], dict]:
    from engine.types import FinalEvent, Timings, TokenEvent

    shape = shape_class(T3Chat())
    events = []
    for n in range(1, 5):
        events += shape.token(TokenEvent(0, 0, "", n, 30, n_cache=10))
    final = FinalEvent(0, 0, "", [], "eos", "", 30, 4, 10, False, False, Timings(10, 20, 1, 4, 1))
    return events + shape.final(final, stream=True), shape.final(final, stream=False)[0]


def test_messages_blocks_from_reasoning_text_and_a_tool_call():
    events, answer = t3_events(messages.MessagesShape)
    start, *rest = events
    assert start["message"]["usage"] == {"cache_read_input_tokens": 10, "input_tokens": 20,
                                         "output_tokens": 0}
    thinking = {"type": "thinking", "thinking": ""}
    tool = {"type": "tool_use", "id": "abc", "name": "get_weather"}
    assert rest == [
        {"type": "content_block_start", "index": 0, "content_block": thinking},
        {"type": "content_block_delta", "index": 0,
         "delta": {"type": "thinking_delta", "thinking": "User wants"}},
        {"type": "content_block_delta", "index": 0,
         "delta": {"type": "thinking_delta", "thinking": " weather.\n"}},
        {"type": "content_block_start", "index": 1, "content_block": {"type": "text", "text": ""}},
        {"type": "content_block_delta", "index": 1,
         "delta": {"type": "text_delta", "text": "Checking."}},
        {"type": "content_block_delta", "index": 1, "delta": {"type": "text_delta", "text": "\n"}},
        {"type": "content_block_start", "index": 2, "content_block": tool},
        {"type": "content_block_delta", "index": 2,
         "delta": {"type": "input_json_delta", "partial_json": "{"}},
        {"type": "content_block_delta", "index": 2,
         "delta": {"type": "input_json_delta", "partial_json": '"location": "Paris"}'}},
        {"type": "content_block_delta", "index": 0,
         "delta": {"type": "signature_delta", "signature": ""}},
        {"type": "content_block_stop", "index": 0},
        {"type": "content_block_stop", "index": 1},
        {"type": "content_block_stop", "index": 2},
        {"type": "message_delta", "delta": {"stop_reason": "tool_use", "stop_sequence": None},
         "usage": {"output_tokens": 4}},
        {"type": "message_stop"},
    ]
    assert answer["content"] == [
        {"type": "thinking", "thinking": "User wants weather.\n", "signature": ""},
        {"type": "text", "text": "Checking.\n"},
        {**tool, "input": {"location": "Paris"}}]
    assert answer["stop_reason"] == "tool_use"
    assert answer["usage"] == {"cache_read_input_tokens": 10, "input_tokens": 20,
                               "output_tokens": 4}


def test_responses_items_from_reasoning_text_and_a_tool_call():
    events, answer = t3_events(responses.ResponsesShape)
    assert [e["type"] for e in events] == [
        "response.created", "response.in_progress",
        "response.output_item.added", "response.reasoning_text.delta",
        "response.reasoning_text.delta",
        "response.output_item.added", "response.content_part.added",
        "response.output_text.delta", "response.output_text.delta",
        "response.output_item.added", "response.function_call_arguments.delta",
        "response.function_call_arguments.delta",
        "response.output_item.done", "response.output_text.done", "response.content_part.done",
        "response.output_item.done", "response.output_item.done", "response.completed"]
    call_added = events[9]["item"]
    assert call_added == {"id": "fc_abc", "arguments": "", "call_id": "call_abc",
                          "name": "get_weather", "type": "function_call",
                          "status": "in_progress"}
    assert {e["item_id"] for e in events if e["type"].endswith("arguments.delta")} == {"fc_abc"}
    completed = events[-1]
    assert completed["timings"] == {"predicted_n": 4}
    reasoning, message, call = completed["response"]["output"]
    assert reasoning["id"] == events[2]["item"]["id"] and reasoning["id"].startswith("rs_")
    assert reasoning["content"] == [{"text": "User wants weather.\n", "type": "reasoning_text"}]
    assert message["content"][0]["text"] == "Checking.\n"
    assert call == {"id": "fc_abc", "type": "function_call", "status": "completed",
                    "arguments": '{"location": "Paris"}', "call_id": "call_abc",
                    "name": "get_weather"}
    assert completed["response"]["usage"] == {"input_tokens": 30, "output_tokens": 4,
                                              "total_tokens": 34,
                                              "input_tokens_details": {"cached_tokens": 10}}
    assert [item["type"] for item in answer["output"]] == ["reasoning", "message",
                                                           "function_call"]
    assert answer["output"][2] == call and answer["output"][0]["status"] == "completed"
