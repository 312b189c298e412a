"""What the protocols read from the chat path's answers, and the base of their shapes.

A protocol shape wraps the chat shape (deployments/api/shapes.py ``OaiChatShape``): every
chat.completion answer and chat.completion.chunk it makes is read here, as llama-server's
converters read its parsed chat message and its diffs (content, reasoning_content, tool calls),
and turned into the protocol's objects and events. Nothing here renders, parses or samples.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from deployments.api.framing import Framing, dumps
from deployments.api.shapes import OaiChatShape
from engine.types import FinalEvent, ProgressEvent, TokenEvent


@dataclass
class ToolCall:
    id: str
    name: str
    arguments: str = ""

    def input(self) -> Any:
        """The arguments as JSON, ``{}`` when they do not parse (a call cut short)."""
        try:
            return json.loads(self.arguments)
        except ValueError:
            return {}


@dataclass
class Diff:
    """One chat delta: what it adds to the reasoning, the content and one tool call."""

    reasoning: str = ""
    content: str = ""
    tool_index: int = -1
    tool_id: str = ""  # set when the call first appears, with its name
    tool_name: str = ""
    arguments: str = ""


@dataclass
class Message:
    """The assistant message: a non-stream answer's, or a stream's so far."""

    content: str = ""
    reasoning: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)

    def add(self, diff: Diff) -> None:
        self.reasoning += diff.reasoning
        self.content += diff.content
        if diff.tool_index < 0:
            return
        while len(self.tool_calls) <= diff.tool_index:
            self.tool_calls.append(ToolCall("", ""))
        call = self.tool_calls[diff.tool_index]
        call.id = diff.tool_id or call.id
        call.name = diff.tool_name or call.name
        call.arguments += diff.arguments


def message_of(chat_answer: dict) -> Message:
    """The message of a non-stream chat.completion answer."""
    message = chat_answer["choices"][0]["message"]
    calls = [ToolCall(c.get("id", ""), c["function"]["name"], c["function"]["arguments"])
             for c in message.get("tool_calls") or ()]
    return Message(message.get("content") or "", message.get("reasoning_content") or "", calls)


def diffs(chunks: list[dict]) -> Iterator[Diff]:
    """The diffs carried by chat.completion.chunk frames (the role-only first delta, the finish
    and usage chunks carry none)."""
    for chunk in chunks:
        if not chunk["choices"]:
            continue
        delta = chunk["choices"][0].get("delta") or {}
        diff = Diff(reasoning=delta.get("reasoning_content") or "",
                    content=delta.get("content") or "")
        calls = delta.get("tool_calls") or ()
        if not calls and (diff.reasoning or diff.content):
            yield diff
        for i, call in enumerate(calls):  # one call per diff, after the text (as the reference)
            part = diff if i == 0 else Diff()
            function = call.get("function") or {}
            part.tool_index = call["index"]
            part.tool_id = call.get("id") or ""
            part.tool_name = function.get("name") or ""
            part.arguments = function.get("arguments") or ""
            yield part


def finish_reason(chunks: list[dict]) -> str:
    return next(c["choices"][0]["finish_reason"] for c in chunks
                if c["choices"] and c["choices"][0]["finish_reason"])


def timings_of(frames: list[dict]) -> dict | None:
    """The ``timings`` the chat shape put on a batch of frames (its last one carries them)."""
    return next((f["timings"] for f in reversed(frames) if "timings" in f), None)


def usage_of(chat_usage: dict) -> tuple[int, int, int]:
    """(prompt tokens, of which cached, generated tokens) from a chat ``usage``."""
    return (chat_usage["prompt_tokens"], chat_usage["prompt_tokens_details"]["cached_tokens"],
            chat_usage["completion_tokens"])


def event_sse(frame: dict) -> bytes:
    """An SSE frame named by its ``type``, as both protocols send them."""
    return b"event: " + frame["type"].encode() + b"\ndata: " + dumps(frame) + b"\n\n"


class ChatConversion(Framing):
    """A protocol's shape over the chat shape. Subclasses convert a non-stream chat answer
    (``answer``) and a batch of chat chunks (``on_token``, ``on_final``), keeping one stream
    state per choice index (``new_stream``)."""

    def __init__(self, chat: OaiChatShape):
        self.chat = chat
        self.ctx = chat.ctx
        self.streams: dict[int, Any] = {}

    def encode(self, frame: dict) -> bytes:
        return event_sse(frame)

    def stream_of(self, index: int) -> Any:
        if index not in self.streams:
            self.streams[index] = self.new_stream()
        return self.streams[index]

    def token(self, ev: TokenEvent) -> list[dict]:
        return self.on_token(self.stream_of(ev.index), ev, self.chat.token(ev))

    def progress(self, ev: ProgressEvent) -> list[dict]:
        return []

    def final(self, ev: FinalEvent, stream: bool) -> list[dict]:
        chunks = self.chat.final(ev, stream)
        if not stream:
            return [self.answer(chunks[0], ev)]
        return self.on_final(self.stream_of(ev.index), ev, chunks)

    def new_stream(self) -> Any:
        raise NotImplementedError

    def answer(self, chat_answer: dict, ev: FinalEvent) -> dict:
        raise NotImplementedError

    def on_token(self, stream: Any, ev: TokenEvent, chunks: list[dict]) -> list[dict]:
        raise NotImplementedError

    def on_final(self, stream: Any, ev: FinalEvent, chunks: list[dict]) -> list[dict]:
        raise NotImplementedError
