"""The Anthropic Messages API over the chat path, as llama-server b10621 converts it
(tools/server/server-chat.cpp ``server_chat_convert_anthropic_to_oai``, server-task.cpp
``to_json_anthropic*``).

``to_chat`` builds a chat-completions body from the fields the Messages API defines (the others
are not passed on, as in the reference); the chat route then validates it, so ``max_tokens`` has
the chat route's limits and messages. ``MessagesShape`` turns the chat shape's answers into a
``message`` object and its chunks into the Messages streaming events.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

from deployments.api.errors import invalid
from deployments.api.framing import dumps
from deployments.api.protocols.chat_answers import (
    ChatConversion,
    Message,
    diffs,
    finish_reason,
    message_of,
    usage_of,
)
from engine.types import FinalEvent, TokenEvent

DEFAULT_MAX_TOKENS = 4096  # max_tokens is required by Anthropic; the reference defaults it
DEFAULT_THINKING_BUDGET = 10000
PASSED_ON = ("temperature", "top_p", "top_k", "stream", "chat_template_kwargs")
STOP_REASONS = {"stop": "end_turn", "tool_calls": "tool_use", "length": "max_tokens"}
BILLING_HEADER = "x-anthropic-billing-header:"


def _text(obj: Any, key: str) -> str:
    """``obj[key]`` when it is a string, else ""."""
    value = obj.get(key) if isinstance(obj, dict) else None
    return value if isinstance(value, str) else ""


def _compact(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def to_chat(body: Any) -> dict:
    """The chat-completions body of a Messages request."""
    if not isinstance(body, dict) or "messages" not in body:
        raise invalid("'messages' is required")
    messages = []
    if body.get("system") is not None:
        messages.append({"role": "system", "content": _system(body["system"])})
    if isinstance(body["messages"], list):
        for message in body["messages"]:
            messages += _chat_messages(message)
    chat: dict[str, Any] = {"messages": messages}
    if isinstance(body.get("tools"), list):
        chat["tools"] = [{"type": "function", "function": {
            "name": _text(tool, "name"), "description": _text(tool, "description"),
            "parameters": tool["input_schema"] if isinstance(tool, dict) and "input_schema" in tool
            else {}}} for tool in body["tools"]]
    _tool_choice(body.get("tool_choice"), chat)
    if "stop_sequences" in body:
        chat["stop"] = body["stop_sequences"]
    chat["max_tokens"] = body.get("max_tokens", DEFAULT_MAX_TOKENS)
    chat.update({key: body[key] for key in PASSED_ON if key in body})
    thinking = body.get("thinking")
    if isinstance(thinking, dict) and thinking.get("type") == "enabled":
        budget = thinking.get("budget_tokens")
        usable = isinstance(budget, (int, float)) and math.isfinite(budget)
        chat["thinking_budget_tokens"] = int(budget) if usable else DEFAULT_THINKING_BUDGET
    user_id = _text(body.get("metadata"), "user_id")
    if user_id:
        chat["__metadata_user_id"] = user_id
    return chat


def _tool_choice(choice: Any, chat: dict) -> None:
    """auto, any (a call is required), tool (that one is required), none; as the chat route's
    ``tool_choice`` and ``parallel_tool_calls``."""
    if not isinstance(choice, dict):
        return
    kind = choice.get("type")
    if kind in ("auto", "none"):
        chat["tool_choice"] = kind
    elif kind == "any":
        chat["tool_choice"] = "required"
    elif kind == "tool":
        chat["tool_choice"] = {"type": "function", "function": {"name": choice.get("name")}}
    if choice.get("disable_parallel_tool_use") is True:
        chat["parallel_tool_calls"] = False


def _system(system: Any) -> str:
    if isinstance(system, str):
        return _same_billing_stamp(system)
    if isinstance(system, list):
        return "".join(_same_billing_stamp(_text(block, "text")) for block in system
                       if _text(block, "type") == "text")
    return ""


def _same_billing_stamp(text: str) -> str:
    """Claude Code's system prompt starts with a billing header whose ``cch=`` stamp changes on
    every request; the reference blanks it (to fffff) so the prompt cache gets past it."""
    if not text.startswith(BILLING_HEADER):
        return text
    at = text.find("cch=", len(BILLING_HEADER))
    if at < 0:
        return text
    start = at + 4
    if start + 5 < len(text) and text[start + 5] == ";":
        return text[:start] + "fffff" + text[start + 5:]
    return text


def _chat_messages(message: Any) -> list[dict]:
    """One Messages message as chat messages: its text, thinking and tool_use blocks make one
    message (tool_calls, reasoning_content), each tool_result block a ``tool`` message after it.
    A message whose content is not a list is passed on for the chat route to judge."""
    role = _text(message, "role")
    if not isinstance(message, dict) or "content" not in message:
        return [] if role == "assistant" else [message]
    if not isinstance(message["content"], list):
        return [message]
    parts: list[dict] = []
    calls: list[dict] = []
    results: list[dict] = []
    reasoning = ""
    for block in message["content"]:
        kind = _text(block, "type")
        if kind == "text":
            parts.append(block)
        elif kind == "thinking":
            reasoning += _text(block, "thinking")
        elif kind == "image":
            parts += _image(block)
        elif kind == "tool_use":
            arguments = block.get("input")
            calls.append({"id": _text(block, "id"), "type": "function", "function": {
                "name": _text(block, "name"),
                "arguments": _compact({} if arguments is None else arguments)}})
        elif kind == "tool_result":
            results.append({"role": "tool", "tool_call_id": _text(block, "tool_use_id"),
                            "content": _result_content(block.get("content"))})
    out = []
    if parts or calls or reasoning:
        converted: dict[str, Any] = {"role": role, "content": parts or ""}
        if calls:
            converted["tool_calls"] = calls
        if reasoning:
            converted["reasoning_content"] = reasoning
        out.append(converted)
    return out + results


def _image(block: dict) -> list[dict]:
    """An image block as the chat route's image part (which the chat route refuses: mlxray
    serves text-only models)."""
    source = block.get("source") if isinstance(block.get("source"), dict) else {}
    kind = _text(source, "type")
    if kind == "base64":
        media = _text(source, "media_type") or "image/jpeg"
        url = f"data:{media};base64,{_text(source, 'data')}"
    elif kind == "url":
        url = _text(source, "url")
    else:
        return []
    return [{"type": "image_url", "image_url": {"url": url}}]


def _result_content(content: Any) -> str | list:
    """A tool result's content: its text blocks joined, or parts when it holds an image."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        return ""
    text, parts, images = "", [], False
    for block in content:
        kind = _text(block, "type")
        if kind == "text":
            text += _text(block, "text")
            parts.append({"type": "text", "text": _text(block, "text")})
        elif kind == "image":
            images = True
            parts += _image(block)
    return parts if images else text


# ---- answers ------------------------------------------------------------------------------
def _usage(prompt: int, cached: int, generated: int) -> dict:
    return {"cache_read_input_tokens": cached, "input_tokens": prompt - cached,
            "output_tokens": generated}


def _blocks(message: Message) -> list[dict]:
    blocks = []
    if message.reasoning:
        blocks.append({"type": "thinking", "thinking": message.reasoning, "signature": ""})
    if message.content:
        blocks.append({"type": "text", "text": message.content})
    blocks += [{"type": "tool_use", "id": call.id, "name": call.name, "input": call.input()}
               for call in message.tool_calls]
    return blocks


def _block_start(index: int, block: dict) -> dict:
    return {"type": "content_block_start", "index": index, "content_block": block}


def _block_delta(index: int, delta: dict) -> dict:
    return {"type": "content_block_delta", "index": index, "delta": delta}


def _block_stop(index: int) -> dict:
    return {"type": "content_block_stop", "index": index}


@dataclass
class _Stream:
    started: bool = False
    thinking_open: bool = False
    text_open: bool = False
    message: Message = field(default_factory=Message)


class MessagesShape(ChatConversion):
    """``message`` objects and the Messages streaming events, from the chat shape's; the id is
    the chat completion's (``chatcmpl-…``), as the reference's. A stream's error is an ``error``
    event carrying the error object."""

    def encode_error(self, envelope: dict) -> bytes:
        return b"event: error\ndata: " + dumps(envelope["error"]) + b"\n\n"

    def new_stream(self) -> _Stream:
        return _Stream()

    def answer(self, chat_answer: dict, ev: FinalEvent) -> dict:
        return {"id": chat_answer["id"], "type": "message", "role": "assistant",
                "content": _blocks(message_of(chat_answer)), "model": self.ctx.model,
                "stop_reason": STOP_REASONS[chat_answer["choices"][0]["finish_reason"]],
                "stop_sequence": ev.stopping_word or None,
                "usage": _usage(*usage_of(chat_answer["usage"]))}

    def on_token(self, stream: _Stream, ev: TokenEvent, chunks: list[dict]) -> list[dict]:
        events = []
        if not stream.started:
            stream.started = True
            events.append({"type": "message_start", "message": {
                "id": self.ctx.id, "type": "message", "role": "assistant", "content": [],
                "model": self.ctx.model, "stop_reason": None, "stop_sequence": None,
                "usage": _usage(ev.n_prompt, ev.n_cache, 0)}})
        return events + self._deltas(stream, chunks)

    def on_final(self, stream: _Stream, ev: FinalEvent, chunks: list[dict]) -> list[dict]:
        events = self._deltas(stream, chunks)
        message = stream.message
        thinking, text = bool(message.reasoning), bool(message.content)
        if thinking:  # the API wants a signature before a thinking block ends; none is made here
            events += [_block_delta(0, {"type": "signature_delta", "signature": ""}),
                       _block_stop(0)]
        if text:
            events.append(_block_stop(int(thinking)))
        events += [_block_stop(thinking + text + i) for i in range(len(message.tool_calls))]
        events += [
            {"type": "message_delta",
             "delta": {"stop_reason": STOP_REASONS[finish_reason(chunks)],
                       "stop_sequence": ev.stopping_word or None},
             "usage": {"output_tokens": ev.n_predicted}},
            {"type": "message_stop"},
        ]
        return events

    def _deltas(self, stream: _Stream, chunks: list[dict]) -> list[dict]:
        """Content blocks in the reference's order: thinking (0), text (0, or 1 after thinking),
        then one tool_use block per call."""
        events: list[dict] = []
        for diff in diffs(chunks):
            stream.message.add(diff)
            thinking = int(bool(stream.message.reasoning))
            if diff.reasoning:
                if not stream.thinking_open:
                    stream.thinking_open = True
                    events.append(_block_start(0, {"type": "thinking", "thinking": ""}))
                events.append(_block_delta(0, {"type": "thinking_delta",
                                               "thinking": diff.reasoning}))
            if diff.content:
                if not stream.text_open:
                    stream.text_open = True
                    events.append(_block_start(thinking, {"type": "text", "text": ""}))
                events.append(_block_delta(thinking, {"type": "text_delta", "text": diff.content}))
            if diff.tool_index < 0:
                continue
            index = thinking + stream.text_open + diff.tool_index
            if diff.tool_name:
                events.append(_block_start(index, {"type": "tool_use", "id": diff.tool_id,
                                                   "name": diff.tool_name}))
            if diff.arguments:
                events.append(_block_delta(index, {"type": "input_json_delta",
                                                   "partial_json": diff.arguments}))
        return events
