"""The spec's test plan (../shared/spec/llama-server-tool-calling.md §9) on the shaper's chat
shape: the model outputs the plan gives, as token events split where it splits them, through
the code that answers /v1/chat/completions (deployments/api/tools/stream.py), streamed and not.
T7(b) and T7(d) are replaced by mlxray's own behaviour, which test_tool_formats.py and
test_tools.py run on a real model."""

from __future__ import annotations

import re

import pytest

from deployments.api.errors import ApiError
from deployments.api.schema import CompletionParams
from deployments.api.shapes import OaiContext
from deployments.api.tools.stream import ToolChatShape
from deployments.api.tools.syntax import (
    DEEPSEEK_R1,
    GPT_OSS,
    HERMES,
    LLAMA3,
    MISTRAL,
    QWEN3_CODER,
    ChatSyntax,
    detect_format,
)
from engine.types import FinalEvent, Timings, TokenEvent

from ..tool_models import TEMPLATES, WEATHER

TOOL = {"name": "get_weather", "parameters": WEATHER["function"]["parameters"]}
WRITE = {"name": "write_file", "parameters": {"type": "object", "properties": {
    "path": {"type": "string"}, "content": {"type": "string"}, "mode": {"type": "integer"}}}}
ID32 = re.compile(r"^[0-9A-Za-z]{32}$")
T1 = ('Let me check.<tool_call>\n{"name": "get_weather", "arguments": {"location": "Paris", '
      '"unit": "c"}}\n</tool_call>')


def syntax(fmt: str = HERMES, *tools: dict, **kw) -> ChatSyntax:
    return ChatSyntax(fmt, tools or (TOOL,), parse_tools=kw.pop("parse_tools", True), **kw)


def shape(syn: ChatSyntax) -> ToolChatShape:
    return ToolChatShape(CompletionParams(), OaiContext("chat.completion", "chatcmpl-x", 0, "m",
                                                        "fp", chat=syn))


def final_event(text: str, n: int, stop: str = "eos") -> FinalEvent:
    return FinalEvent(0, 0, text, [], stop, "", 3, n, 0, False, False,
                      Timings(0, 3, 1.0, n, 1.0))


def message(syn: ChatSyntax, text: str, stop: str = "eos") -> tuple[dict, str]:
    choice = shape(syn).final(final_event(text, 1, stop), stream=False)[0]["choices"][0]
    return choice["message"], choice["finish_reason"]


def stream(syn: ChatSyntax, chunks: list[str], stop: str = "eos") -> list[list[dict]]:
    """The deltas each chunk produced, then the final ones (with the finish reason)."""
    s = shape(syn)
    out = []
    for n, chunk in enumerate(chunks, 1):
        out.append([f["choices"][0]["delta"] for f in s.token(TokenEvent(0, 7, chunk, n, 3))])
    frames = s.final(final_event("".join(chunks), len(chunks), stop), stream=True)
    out.append([(f["choices"][0]["delta"], f["choices"][0]["finish_reason"])
                for f in frames if f["choices"]])
    return out


def args(*fragments: str) -> list[list[dict]]:
    return [[{"tool_calls": [{"index": 0, "function": {"arguments": f}}]}] for f in fragments]


def test_t1_hermes_content_and_call():
    msg, finish = message(syntax(), T1)
    call = msg["tool_calls"][0]
    assert msg == {"role": "assistant", "content": "Let me check.", "tool_calls": [
        {"type": "function", "function": {
            "name": "get_weather", "arguments": '{"location": "Paris", "unit": "c"}'},
         "id": call["id"]}]}
    assert ID32.match(call["id"]) and finish == "tool_calls"


T2 = ["OK", " <", "tool", "_call", ">\n", '{"', "name", '":', ' "', "get", "_weather", '",',
      ' "', "arguments", '":', ' {"', "location", '":', ' "', "Par", "is", '"}}', "\n</",
      "tool", "_call", ">"]


def test_t2_hermes_stream_token_by_token():
    out = stream(syntax(), T2)
    assert out[0] == [{"role": "assistant", "content": None}, {"content": "OK"}]
    assert out[1] == [{"content": " "}]  # the "<" held back
    assert out[2:11] == [[]] * 9
    [[header]] = [d["tool_calls"] for d in out[11]]
    assert ID32.match(header.pop("id"))
    assert header == {"index": 0, "type": "function",
                      "function": {"name": "get_weather", "arguments": "{"}}
    assert out[12:15] == [[]] * 3
    assert out[15:22] == args('"', "location", '":', ' "', "Par", "is", '"}')
    assert out[22:26] == [[]] * 4
    assert out[26] == [({}, "tool_calls")]


def test_t3_qwen3_reasoning_then_call():
    text = ('<think>\nUser wants weather.\n</think>\n\nChecking.\n<tool_call>\n{"name": '
            '"get_weather", "arguments": {"location": "Paris"}}\n</tool_call>')
    syn = syntax(reasoning=True, thinks=True)
    msg, _ = message(syn, text)
    assert (msg["reasoning_content"], msg["content"]) == ("User wants weather.\n", "Checking.\n")
    assert len(msg["tool_calls"]) == 1
    first, second = len("<think>\nUser wants"), text.index("Checking.") + len("Checking.")
    cut = [text[:first], text[first:second], text[second:]]
    assert cut[:2] == ["<think>\nUser wants", " weather.\n</think>\n\nChecking."]
    out = stream(syn, cut)
    assert out[0][1:] == [{"reasoning_content": "User wants"}]
    assert out[1] == [{"reasoning_content": " weather.\n"}, {"content": "Checking."}]
    assert out[2][0] == {"content": "\n"}
    assert out[2][1]["tool_calls"][0]["function"] == {"name": "get_weather",
                                                      "arguments": '{"location": "Paris"}'}
    plain, _ = message(syntax(reasoning=False, thinks=True), text)
    assert plain["content"] == text[: text.index("<tool_call>")]


def test_t4_qwen35_prefilled_think_and_xml():
    text = ("Need weather.\n</think>\n\n<tool_call>\n<function=get_weather>\n"
            "<parameter=location>\nParis\n</parameter>\n</function>\n</tool_call>")
    syn = syntax(QWEN3_CODER, reasoning=True, thinks=True, in_reasoning=True)
    msg, finish = message(syn, text)
    assert (msg["reasoning_content"], msg["content"]) == ("Need weather.\n", "")
    assert msg["tool_calls"][0]["function"]["arguments"] == '{"location":"Paris"}'
    assert finish == "tool_calls"


T5 = ["<tool_call>", "\n", "<function=write_file>", "\n", "<parameter=path>", "\n", "a.py", "\n",
      "</parameter>", "\n", "<parameter=content>", "\n", 'print("hi")', "\n", "x = 1", "\n",
      "</parameter>", "\n", "<parameter=mode>", "\n", "644", "\n", "</parameter>", "\n",
      "</function>", "\n", "</tool_call>"]


def test_t5_qwen3_coder_stream():
    out = stream(syntax(QWEN3_CODER, WRITE), T5)
    deltas = [d for step in out[:-1] for d in step if "tool_calls" in d]
    assert deltas[0]["tool_calls"][0]["function"] == {"name": "write_file", "arguments": "{"}
    assert out[3] == [deltas[0]]  # after the \n that follows <function=...>
    fragments = [d["tool_calls"][0]["function"]["arguments"] for d in deltas[1:]]
    assert fragments == ['"path":"', "a.py", '"', ',"content":"', 'print(\\"hi\\")',
                         "\\nx = 1", '"', ',"mode":', "644", "}"]
    assert "".join(fragments) == '"path":"a.py","content":"print(\\"hi\\")\\nx = 1","mode":644}'


def test_t6_parallel_calls():
    one = '<tool_call>\n{"name": "get_weather", "arguments": {"location": "%s"}}\n</tool_call>'
    text = one % "Paris" + "\n\n" + one % "Rome"
    msg, _ = message(syntax(), text)
    ids = [c["id"] for c in msg["tool_calls"]]
    assert len(set(ids)) == 2
    assert [c["function"]["arguments"] for c in msg["tool_calls"]] == [
        '{"location": "Paris"}', '{"location": "Rome"}']
    second = len(one % "Paris") + 2
    name_end = text.index('"get_weather",', second) + len('"get_weather",')
    out = stream(syntax(), [text[:name_end - 1], text[name_end - 1:name_end], text[name_end:]])
    assert not any(c["index"] == 1 for d in out[0] for c in d.get("tool_calls", []))
    [[header]] = [d["tool_calls"] for d in out[1]]
    assert header["index"] == 1 and header["id"] != out[0][-1]["tool_calls"][0].get("id")


def test_t7a_tool_choice_none_keeps_the_markup():
    msg, finish = message(syntax(parse_tools=False), T1)
    assert msg == {"role": "assistant", "content": T1} and finish == "stop"


def test_t7c_response_schema_wins_over_tools():
    syn = syntax(parse_tools=False, json_only=True)
    assert message(syn, '{"a": 1}') == ({"role": "assistant", "content": '{"a": 1}'}, "stop")
    with pytest.raises(ApiError) as err:
        message(syn, T1)
    assert err.value.code == 500 and err.value.type == "server_error"


@pytest.mark.parametrize("text", [
    '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>',
    '<tool_call>\n{"name": "get_weather", "arguments": {"location": "Paris"}}\n</tool_call>Done.',
    '<tool_call>\n{"name": "get_weather", "arguments": {"location": Paris}}\n</tool_call>',
    '<tool_call>\n{"arguments": {"location": "Paris"}, "name": "get_weather"}\n</tool_call>',
])
def test_t8_output_the_format_refuses_is_500(text):
    with pytest.raises(ApiError) as err:
        message(syntax(), text)
    assert (err.value.code, err.value.message) == (
        500, "The model produced output that does not match the expected peg-native format")
    s = shape(syntax())
    for n, char in enumerate(text, 1):  # streamed: no error until the end
        s.token(TokenEvent(0, 7, char, n, 3))
    with pytest.raises(ApiError):
        s.final(final_event(text, len(text)), stream=True)


def test_t9_truncated_call_at_the_limit():
    text = 'Sure <tool_call>\n{"name": "get_weather", "arguments": {"location": "Par'
    msg, finish = message(syntax(), text, stop="limit")
    assert msg["content"] == "Sure " and finish == "length"
    assert msg["tool_calls"][0]["function"]["arguments"] == '{"location": "Par'


def test_t10_other_formats():
    harmony = ('<|channel|>analysis<|message|>Need weather.<|end|><|start|>assistant<|channel|>'
               'commentary to=functions.get_weather <|constrain|>json<|message|>'
               '{"location":"Paris"}')
    msg, _ = message(syntax(GPT_OSS, reasoning=True), harmony)
    assert msg["reasoning_content"] == "Need weather."
    assert msg["tool_calls"][0]["function"]["arguments"] == '{"location":"Paris"}'
    nemo = ('[TOOL_CALLS][{"name": "get_weather", "arguments": {"location": "Paris"}, '
            '"id": "abcDEF123"}]')
    msg, _ = message(syntax(MISTRAL), nemo)
    assert msg["tool_calls"][0]["id"] == "abcDEF123"
    msg, _ = message(syntax(LLAMA3), '{"name": "get_weather", "parameters": {"location": "Paris"}}')
    assert msg["tool_calls"][0]["function"]["arguments"] == '{"location": "Paris"}'
    with pytest.raises(ApiError):  # Llama: a { in prose is a call that does not parse
        message(syntax(LLAMA3), 'Here is JSON: {"a": 1}')
    r1 = ('\nThinking\n</think>\n\n<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>'
          'function<｜tool▁sep｜>get_weather\n```json\n{"location": "Paris"}\n```'
          '<｜tool▁call▁end｜><｜tool▁calls▁end｜>')
    msg, _ = message(syntax(DEEPSEEK_R1, reasoning=True, in_reasoning=True, trim=False), r1)
    assert (msg["reasoning_content"], msg["content"]) == ("\nThinking\n", "\n\n")
    assert msg["tool_calls"][0]["function"]["arguments"] == '{"location": "Paris"}'


@pytest.mark.parametrize("name, fmt", [
    ("hermes_think", HERMES), ("qwen35_xml", QWEN3_CODER), ("llama3", LLAMA3),
    ("mistral", MISTRAL), ("deepseek_r1", DEEPSEEK_R1), ("gpt_oss", GPT_OSS)])
def test_format_is_derived_from_the_template(name, fmt):
    assert detect_format((TEMPLATES / f"{name}.jinja").read_text()) == fmt
