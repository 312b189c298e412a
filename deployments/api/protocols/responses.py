"""The OpenAI Responses API over the chat path, as llama-server b10621 converts it
(tools/server/server-chat.cpp ``server_chat_convert_responses_to_chatcmpl``, server-task.cpp
``to_json_oaicompat_resp*``).

``to_chat`` turns a Responses body into a chat-completions body: every other field passes
through, so the chat route's validation and limits apply (``max_output_tokens`` is checked as
``max_tokens``). ``ResponsesShape`` turns the chat shape's answers into a ``response`` object and
its chunks into the Responses streaming events.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from deployments.api.errors import invalid
from deployments.api.openai_requests import random_string
from deployments.api.protocols.chat_answers import (
    ChatConversion,
    Message,
    ToolCall,
    diffs,
    message_of,
    timings_of,
    usage_of,
)
from deployments.api.shapes import oai_usage, progress_frame
from engine.types import FinalEvent, ProgressEvent, TokenEvent

# fields the conversion replaces; everything else is the chat body's as sent
_CONVERTED = ("input", "instructions", "tools", "max_output_tokens", "reasoning")
_INPUT_ROLES = ("user", "system", "developer")


def to_chat(body: Any) -> dict:
    """The chat-completions body of a Responses request."""
    if not isinstance(body, dict) or "input" not in body:
        raise invalid("'input' is required")
    previous = body.get("previous_response_id")
    if isinstance(previous, str) and previous:
        raise invalid("llama.cpp does not support 'previous_response_id'.")
    chat = {k: v for k, v in body.items() if k not in _CONVERTED}
    messages: list[dict] = []
    if "instructions" in body:
        instructions = body["instructions"]
        messages.append({"role": "system",
                         "content": instructions if isinstance(instructions, str) else ""})
    source = body["input"]
    if isinstance(source, str):
        messages.append({"role": "user", "content": source})
    elif isinstance(source, list):
        for item in source:
            _add_item(messages, item)
    else:
        raise invalid("'input' must be a string or array of objects")
    chat["messages"] = messages
    if "tools" in body:
        tools = _tools(body["tools"])
        if tools:
            chat["tools"] = tools
    if "max_output_tokens" in body:
        chat["max_tokens"] = body["max_output_tokens"]
    reasoning = body.get("reasoning")
    if isinstance(reasoning, dict) and "effort" in reasoning:
        chat["reasoning_effort"] = reasoning["effort"]
    text_format = _text_format(body.get("text"))
    if text_format is not None and "response_format" not in body:
        chat["response_format"] = text_format
    choice = chat.get("tool_choice")
    if isinstance(choice, dict) and choice.get("type") == "function" and "name" in choice:
        # the Responses API names the function flat; the chat route enforces the nested form
        chat["tool_choice"] = {"type": "function", "function": {"name": choice["name"]}}
    return chat


def _is(item: dict, key: str, kind: type) -> bool:
    return isinstance(item.get(key), kind)


def _add_item(messages: list[dict], item: Any) -> None:
    """One input item as chat messages; assistant items merge into an assistant message before
    them (its text, tool calls or reasoning), as the reference merges them."""
    if not isinstance(item, dict):
        raise invalid("Cannot determine type of 'item'")
    merge = bool(messages) and messages[-1].get("role") == "assistant"
    item = dict(item)
    if _is(item, "content", str):
        item["content"] = [{"text": item["content"], "type": "input_text"}]
    role, kind = item.get("role"), item.get("type")
    if _is(item, "content", list) and isinstance(role, str) and role in _INPUT_ROLES:
        item.pop("type", None)
        item.pop("status", None)
        item["content"] = [_input_part(part) for part in item["content"]]
        messages.append(item)
    elif role == "assistant" and kind == "message":
        parts = [_output_part(part) for part in item["content"]] if _is(
            item, "content", list) else []
        if merge:
            previous = messages[-1]
            if not isinstance(previous.get("content"), list):
                previous["content"] = []
            previous["content"] += parts
        else:
            item.pop("status", None)
            item.pop("type", None)
            item["content"] = parts
            messages.append(item)
    elif (all(_is(item, k, str) for k in ("arguments", "call_id", "name"))
          and kind == "function_call"):
        call = {"function": {"arguments": item["arguments"], "name": item["name"]},
                "id": item["call_id"], "type": "function"}
        if merge:
            messages[-1].setdefault("tool_calls", []).append(call)
        else:
            messages.append({"role": "assistant", "tool_calls": [call]})
    elif (_is(item, "call_id", str) and (_is(item, "output", str) or _is(item, "output", list))
          and kind == "function_call_output"):
        messages.append({"content": _tool_output(item["output"]), "role": "tool",
                         "tool_call_id": item["call_id"]})
    elif _is(item, "summary", list) and kind == "reasoning":
        text = _reasoning_text(item)
        if merge:
            messages[-1]["reasoning_content"] = text
        else:
            messages.append({"role": "assistant", "content": [], "reasoning_content": text})
    else:
        raise invalid("Cannot determine type of 'item'")


def _input_part(part: Any) -> dict:
    kind = part.get("type") if isinstance(part, dict) else None
    if kind == "input_text":
        if "text" not in part:
            raise invalid("'Input text' requires 'text'")
        return {"text": part["text"], "type": "text"}
    if kind == "input_image":
        if "image_url" not in part:
            raise invalid("'image_url' is required")
        return {"image_url": {"url": part["image_url"]}, "type": "image_url"}
    if kind == "input_file":
        raise invalid("'input_file' is not supported by llamacpp at this moment")
    raise invalid("'type' must be one of 'input_text', 'input_image', or 'input_file'")


def _output_part(part: Any) -> dict:
    kind = part.get("type") if isinstance(part, dict) else None
    if kind in ("output_text", "input_text"):
        if not _is(part, "text", str):
            raise invalid("'Output text' requires 'text'")
        return {"text": part["text"], "type": "text"}
    if kind == "refusal":
        if not _is(part, "refusal", str):
            raise invalid("'Refusal' requires 'refusal'")
        return {"refusal": part["refusal"], "type": "refusal"}
    raise invalid("'type' must be one of 'output_text' or 'refusal'")


def _tool_output(output: str | list) -> str | list:
    if isinstance(output, str):
        return output
    parts = []
    for part in output:
        if not isinstance(part, dict) or part.get("type") != "input_text":
            raise invalid("Output of tool call should be 'Input text'")
        parts.append({**part, "type": "text"})
    return parts


def _reasoning_text(item: dict) -> str:
    content = item.get("content")
    if not isinstance(content, list):
        raise invalid("item['content'] is not an array")
    if not content:
        raise invalid("item['content'] is empty")
    if not isinstance(content[0], dict) or not _is(content[0], "text", str):
        raise invalid("item['content']['text'] is not a string")
    return content[0]["text"]


def _text_format(text: Any) -> dict | None:
    """``text.format`` as the chat route's ``response_format`` (OpenAI's Responses API; the
    reference passes ``text`` on to the chat route, which ignores it): what the SDK's
    ``responses.parse(text_format=...)`` sends."""
    fmt = text.get("format") if isinstance(text, dict) else None
    if not isinstance(fmt, dict):
        return None
    if fmt.get("type") == "json_object":
        return {"type": "json_object"}
    if fmt.get("type") == "json_schema":
        return {"type": "json_schema", "json_schema": {
            k: fmt[k] for k in ("name", "schema", "strict") if k in fmt}}
    return None


def _tools(tools: Any) -> list[dict]:
    """Function tools as chat tools (``strict`` defaults to true); other kinds have no chat
    equivalent and are skipped, as the reference skips them."""
    if not isinstance(tools, list):
        raise invalid("'tools' must be an array of objects")
    out = []
    for tool in tools:
        if not isinstance(tool, dict) or tool.get("type") != "function":
            continue
        function = {k: v for k, v in tool.items() if k != "type"}
        function.setdefault("strict", True)
        out.append({"type": "function", "function": function})
    return out


# ---- answers ------------------------------------------------------------------------------
def _usage(chat_usage: dict) -> dict:
    prompt, cached, generated = usage_of(chat_usage)
    return {"input_tokens": prompt, "output_tokens": generated, "total_tokens": prompt + generated,
            "input_tokens_details": {"cached_tokens": cached}}


def _text_part(text: str) -> dict:
    return {"type": "output_text", "annotations": [], "logprobs": [], "text": text}


def _reasoning_item(item_id: str, text: str) -> dict:
    return {"id": item_id, "summary": [], "type": "reasoning",
            "content": [{"text": text, "type": "reasoning_text"}], "encrypted_content": ""}


def _call_item(call: ToolCall) -> dict:
    return {"id": "fc_" + call.id, "type": "function_call", "status": "completed",
            "arguments": call.arguments, "call_id": "call_" + call.id, "name": call.name}


def _in_progress(response_id: str, kind: str) -> dict:
    return {"type": kind, "response": {"id": response_id, "object": "response",
                                       "status": "in_progress"}}


TEXT_EVENTS = ("output_text.delta", "output_text.done", "reasoning_text.delta",
               "reasoning_text.done")


@dataclass
class ResponseStream:
    """One streamed response: its ids, what was opened, the message so far."""

    id: str = field(default_factory=lambda: "resp_" + random_string())
    reasoning_id: str = field(default_factory=lambda: "rs_" + random_string())
    message_id: str = field(default_factory=lambda: "msg_" + random_string())
    created: bool = False
    reasoning_open: bool = False
    text_open: bool = False
    message: Message = field(default_factory=Message)
    sequence: int = 0
    indices: dict[str, int] = field(default_factory=dict)  # output item id -> output_index

    def numbered(self, events: list[dict]) -> list[dict]:
        """OpenAI's ``sequence_number``, ``output_index`` and ``content_index`` (the SDKs'
        event accumulators need them; the reference sends none), after the reference's keys."""
        for event in events:
            item = event.get("item")
            item_id = item.get("id") if isinstance(item, dict) else event.get("item_id")
            if item_id is not None:
                event["output_index"] = self.indices.setdefault(item_id, len(self.indices))
            if "part" in event or event["type"].endswith(TEXT_EVENTS):
                event["content_index"] = 0
            event["sequence_number"] = self.sequence
            self.sequence += 1
        return events


class ResponsesShape(ChatConversion):
    """``response`` objects and the Responses streaming events, from the chat shape's. Several
    choices (``n``) answer an array of responses, as the reference does."""

    def new_stream(self) -> ResponseStream:
        return ResponseStream()

    def answer(self, chat_answer: dict, ev: FinalEvent) -> dict:
        message = message_of(chat_answer)
        output = []
        if message.reasoning:
            item = _reasoning_item("rs_" + random_string(), message.reasoning)
            output.append({**item, "status": "completed"})
        if message.content:
            output.append({"content": [_text_part(message.content)],
                           "id": "msg_" + random_string(), "role": "assistant",
                           "status": "completed", "type": "message"})
        output += [_call_item(call) for call in message.tool_calls]
        now = int(time.time())
        return {"completed_at": now, "created_at": now, "id": "resp_" + random_string(),
                "model": self.ctx.model, "object": "response", "output": output,
                "status": "completed", "usage": _usage(chat_answer["usage"])}

    def progress(self, ev: ProgressEvent) -> list[dict]:
        stream = self.stream_of(ev.index)
        events = self._opening(stream) or [_in_progress(stream.id, "response.in_progress")]
        events[-1].update({k: v for k, v in progress_frame(ev).items()
                           if k in ("timings", "prompt_progress")})
        return stream.numbered(events)

    def on_token(self, stream: ResponseStream, ev: TokenEvent, chunks: list[dict]) -> list[dict]:
        events = self._opening(stream) + self._deltas(stream, chunks)
        timings = timings_of(chunks)
        if events and timings is not None:
            events[-1]["timings"] = timings
        return stream.numbered(events)

    def on_final(self, stream: ResponseStream, ev: FinalEvent, chunks: list[dict]) -> list[dict]:
        events = self._deltas(stream, chunks)
        message, output = stream.message, []
        if message.reasoning:
            output.append(_reasoning_item(stream.reasoning_id, message.reasoning))
            events.append({"type": "response.output_item.done", "item": output[-1]})
        if message.content:
            part = _text_part(message.content)
            output.append({"type": "message", "status": "completed", "id": stream.message_id,
                           "content": [part], "role": "assistant"})
            events += [
                {"type": "response.output_text.done", "item_id": stream.message_id,
                 "text": message.content},
                {"type": "response.content_part.done", "item_id": stream.message_id,
                 "part": part},
                {"type": "response.output_item.done", "item": output[-1]},
            ]
        for call in message.tool_calls:
            output.append(_call_item(call))
            events.append({"type": "response.output_item.done", "item": output[-1]})
        output.sort(key=lambda item: stream.indices.get(item["id"], len(stream.indices)))
        response = {"id": stream.id, "object": "response", "created_at": int(time.time()),
                    "status": "completed", "model": self.ctx.model, "output": output,
                    "usage": _usage(oai_usage(ev))}
        events.append({"type": "response.completed", "response": response})
        timings = timings_of(chunks)
        if timings is not None:
            events[-1]["timings"] = timings
        return stream.numbered(events)

    def _opening(self, stream: ResponseStream) -> list[dict]:
        if stream.created:
            return []
        stream.created = True
        return [_in_progress(stream.id, "response.created"),
                _in_progress(stream.id, "response.in_progress")]

    def _deltas(self, stream: ResponseStream, chunks: list[dict]) -> list[dict]:
        events: list[dict] = []
        for diff in diffs(chunks):
            stream.message.add(diff)
            if diff.reasoning:
                if not stream.reasoning_open:
                    stream.reasoning_open = True
                    item = _reasoning_item(stream.reasoning_id, "")
                    events.append({"type": "response.output_item.added",
                                   "item": {**item, "content": [], "status": "in_progress"}})
                events.append({"type": "response.reasoning_text.delta", "delta": diff.reasoning,
                               "item_id": stream.reasoning_id})
            if diff.content:
                if not stream.text_open:
                    stream.text_open = True
                    events += [
                        {"type": "response.output_item.added", "item": {
                            "content": [], "id": stream.message_id, "role": "assistant",
                            "status": "in_progress", "type": "message"}},
                        {"type": "response.content_part.added", "item_id": stream.message_id,
                         "part": {"type": "output_text", "text": ""}},
                    ]
                events.append({"type": "response.output_text.delta",
                               "item_id": stream.message_id, "delta": diff.content})
            if diff.tool_index < 0:
                continue
            call = stream.message.tool_calls[diff.tool_index]
            if diff.tool_name:
                events.append({"type": "response.output_item.added", "item": {
                    "id": "fc_" + call.id, "arguments": "", "call_id": "call_" + call.id,
                    "name": call.name, "type": "function_call", "status": "in_progress"}})
            if diff.arguments:
                events.append({"type": "response.function_call_arguments.delta",
                               "delta": diff.arguments, "item_id": "fc_" + call.id})
        return events
