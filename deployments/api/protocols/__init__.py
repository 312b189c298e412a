"""The other chat protocols llama-server serves, each converted onto the chat path: the OpenAI
Responses API (``responses``) and the Anthropic Messages API (``messages``). A request becomes a
chat-completions body (``to_chat``), which the chat route validates, templates and runs; the chat
shape's answers and chunks become the protocol's (``protocol_shape``)."""

from __future__ import annotations

from typing import Any

from deployments.api.protocols import anthropic as messages
from deployments.api.protocols import responses
from deployments.api.protocols.chat_answers import ChatConversion
from deployments.api.shapes import OaiChatShape

TO_CHAT = {"responses": responses.to_chat, "messages": messages.to_chat}
SHAPES = {"responses": responses.ResponsesShape, "messages": messages.MessagesShape}


def to_chat(protocol: str, body: Any) -> dict:
    """The chat-completions body of a ``protocol`` request."""
    return TO_CHAT[protocol](body)


def protocol_shape(protocol: str, chat: OaiChatShape) -> ChatConversion:
    return SHAPES[protocol](chat)
