"""The Responses API (/v1/responses, /responses and their input_tokens counts) and the Anthropic
Messages API (/v1/messages, /v1/messages/count_tokens), over HTTP and the Python handle.

Each request becomes a chat-completions body (deployments/api/protocols/), which goes through the
chat route's own code (deployments/api/openai_requests.py ``chat_body``: validation and the chat
template; then
the native schema and the engine); the chat shape's answers come back converted by the protocol's
shape in the response shaper.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from fastapi import Request
from fastapi.responses import Response

from deployments.api.errors import ApiError, RequestError
from deployments.api.openai_requests import chat_body
from deployments.api.protocols import to_chat
from deployments.api.schema import CompletionParams
from deployments.api.shapes import OaiContext
from deployments.api.tools.syntax import ChatSyntax
from deployments.serve.app import json_response, off_loop, read_json
from deployments.serve.endpoint import IngressBase, ModelEndpoint
from deployments.serve.routes import native, oai
from deployments.serve.routes.resume import conversation_of

CHAT = "chat.completion"


async def answer(ingress: IngressBase, request: Request, protocol: str) -> Response:
    await ingress.guard(request)
    body = await read_json(request, ingress.args.max_body_bytes)
    model = await ingress.model_of(body, request)
    native_body, syntax = await off_loop(_chat_body, protocol, body, model)
    return await oai.answer(model, native_body, CHAT, syntax, protocol,
                            conversation_of(request))


def _chat_body(protocol: str, body: Any, model: ModelEndpoint) -> tuple[dict, ChatSyntax]:
    return chat_body(to_chat(protocol, body), model)


def _count(protocol: str, body: Any, model: ModelEndpoint) -> int:
    return oai.count_input_tokens(model, to_chat(protocol, body))


async def input_tokens(ingress: IngressBase, request: Request, protocol: str) -> Response:
    """The prompt tokens a request would use, without running it: ``{"input_tokens": N}``, with
    ``"object": "response.input_tokens"`` for the Responses API."""
    await ingress.guard(request)
    body = await read_json(request, ingress.args.max_body_bytes)
    model = await ingress.model_of(body, request)
    out: dict[str, Any] = {"input_tokens": await off_loop(_count, protocol, body, model)}
    if protocol == "responses":
        out["object"] = "response.input_tokens"
    return json_response(out)


# ---- Python handle API ---------------------------------------------------------------------
async def _prepare_handle(ingress: IngressBase, body: Any, protocol: str, stream: bool,
                          ) -> tuple[ModelEndpoint, CompletionParams, list[list[int]], OaiContext]:
    try:
        await ingress.check_ready()
        model = await ingress.model_of(body)
        chat, syntax = await off_loop(_chat_body, protocol, native.handle_body(body, stream),
                                      model)
        params, prompts = await off_loop(native.prepare, model, chat)
        return model, params, prompts, oai.context(model, CHAT, params, syntax, protocol)
    except ApiError as err:
        raise RequestError.from_api_error(err) from None


async def complete_handle(ingress: IngressBase, body: Any, protocol: str) -> Any:
    """handle.responses.remote(body), handle.messages.remote(body): the answer as a dict, as the
    HTTP route answers it; errors raise RequestError."""
    return await native.handle_result(*await _prepare_handle(ingress, body, protocol, False))


async def stream_handle(ingress: IngressBase, body: Any, protocol: str) -> AsyncIterator[dict]:
    """handle.options(stream=True).responses_stream.remote(body) (and messages_stream): the
    protocol's stream events as dicts (each names itself in ``type``); an error raises
    RequestError."""
    async for frame in native.handle_frames(*await _prepare_handle(ingress, body, protocol,
                                                                    True)):
        yield frame
