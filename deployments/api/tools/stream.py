"""The chat answer of a request whose output is parsed (tools or reasoning): the message with
``content``, ``reasoning_content`` and ``tool_calls``, and the stream of deltas llama-server
sends for it (spec §4): the whole text is parsed again after every token and compared with the
previous parse; each difference is one chunk (reasoning, then content, then each tool call,
whose first delta carries its id and name and later ones argument fragments).
"""

from __future__ import annotations

import secrets
import string
from typing import Any

from deployments.api.errors import ApiError
from deployments.api.shapes import OaiChatShape, finish_reason, timings_json
from deployments.api.tools.parsers import parse
from deployments.api.tools.syntax import ChatMessage, ParseFailure, ToolCall
from engine.types import FinalEvent, TokenEvent

_ALNUM = string.ascii_letters + string.digits


def tool_call_id() -> str:
    """32 random letters and digits, no prefix (the reference's gen_tool_call_id)."""
    return "".join(secrets.choice(_ALNUM) for _ in range(32))


def _failure(exc: Exception) -> ApiError:
    return ApiError(str(exc), "server_error")


class MessageDiffer:
    """One choice's stream: its text so far, the last parse and the ids given to its calls."""

    def __init__(self) -> None:
        self.text = ""
        self.last = ChatMessage()
        self.ids: list[str] = []

    def id_of(self, index: int, call: ToolCall) -> str:
        while len(self.ids) <= index:
            self.ids.append("")
        if not self.ids[index]:
            self.ids[index] = call.id or tool_call_id()
        return self.ids[index]

    def deltas(self, msg: ChatMessage) -> list[dict]:
        """The deltas from the last parse to ``msg``, in the reference's order."""
        old, out = self.last, []
        for key in ("reasoning_content", "content"):
            before, after = getattr(old, key), getattr(msg, key)
            if after != before:
                if not after.startswith(before):
                    raise ApiError(f"Invalid diff: '{before}' not found at start of '{after}'",
                                   "server_error")
                out.append({key: after[len(before):]})
        if len(msg.tool_calls) < len(old.tool_calls):
            raise ApiError("Invalid diff: tool calls were lost", "server_error")
        for index, call in enumerate(msg.tool_calls):
            if index >= len(old.tool_calls):
                out.append({"tool_calls": [{
                    "index": index, "id": self.id_of(index, call), "type": "function",
                    "function": {"name": call.name, "arguments": call.arguments}}]})
                continue
            before = old.tool_calls[index].arguments
            if call.arguments != before:
                if not call.arguments.startswith(before):
                    raise ApiError("Invalid diff: tool call arguments changed", "server_error")
                out.append({"tool_calls": [{
                    "index": index, "function": {"arguments": call.arguments[len(before):]}}]})
        self.last = msg
        return out


class ToolChatShape(OaiChatShape):
    """/v1/chat/completions when the output is parsed (``OaiContext.chat`` is active)."""

    def __init__(self, p, ctx):
        super().__init__(p, ctx)
        self.syntax = ctx.chat
        self.streams: dict[int, MessageDiffer] = {}

    def _differ(self, index: int) -> MessageDiffer:
        return self.streams.setdefault(index, MessageDiffer())

    def token(self, ev: TokenEvent) -> list[dict]:
        frames = []
        if ev.n_predicted == 1:
            frames.append(self._delta(ev.index, {"role": "assistant", "content": None}))
        differ = self._differ(ev.index)
        differ.text += ev.text
        if ev.text:
            msg = parse(differ.text, self.syntax, partial=True)
            frames += [self._delta(ev.index, d) for d in differ.deltas(msg)]
        if frames and ev.probs is not None:
            frames[-1]["choices"][0]["logprobs"] = {"content": self._probs([ev.probs])}
        if frames and ev.timings is not None:
            frames[-1]["timings"] = timings_json(ev.timings)
        return frames

    def final(self, ev: FinalEvent, stream: bool) -> list[dict]:
        finish = finish_reason(ev)
        text = self._differ(ev.index).text if stream else ev.content
        try:
            # output cut by the limit keeps what it got, a half-written call included
            msg = parse(text, self.syntax, partial=finish == "length", hold=False)
        except ParseFailure as exc:
            raise _failure(exc) from None
        if msg.tool_calls and finish == "stop":
            finish = "tool_calls"
        if stream:
            differ = self._differ(ev.index)
            frames = [self._delta(ev.index, d) for d in differ.deltas(msg)]
            return frames + self._final_chunks(ev, finish)
        choice = self._choice(ev, finish, self._message(ev.index, msg))
        return [self._answer(ev, choice, stream)]

    def _message(self, index: int, msg: ChatMessage) -> dict[str, Any]:
        out: dict[str, Any] = {"role": "assistant", "content": msg.content}
        if msg.reasoning_content:
            out["reasoning_content"] = msg.reasoning_content
        if msg.tool_calls:
            differ = self._differ(index)
            out["tool_calls"] = [
                {"type": "function", "function": {"name": c.name, "arguments": c.arguments},
                 "id": differ.id_of(i, c)} for i, c in enumerate(msg.tool_calls)]
        return out
