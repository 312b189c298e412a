"""The OpenAI-compatible routes: /v1/completions, /v1/chat/completions (and /chat/completions),
/apply-template and the input-token counts. Requests become native ones
(deployments/api/openai_requests.py);
answers take the OpenAI shapes (deployments/api/shapes.py)."""

from __future__ import annotations

import time

from fastapi import Request
from fastapi.responses import Response

from deployments.api.build_info import BUILD_INFO
from deployments.api.errors import invalid
from deployments.api.json_values import json_type
from deployments.api.openai_requests import chat_body, chat_prompt, completion_body, completion_id
from deployments.api.schema import CompletionParams
from deployments.api.shapes import OaiContext
from deployments.api.tools.request import read_tools
from deployments.api.tools.syntax import ChatSyntax
from deployments.serve.app import JSON, json_response, off_loop, read_json, read_object
from deployments.serve.endpoint import IngressBase, ModelEndpoint
from deployments.serve.routes import native
from deployments.serve.routes.resume import conversation_of


def context(model: ModelEndpoint, kind: str, params: CompletionParams,
            chat: ChatSyntax | None = None, protocol: str = "") -> OaiContext:
    return OaiContext(object=kind, id=completion_id(), created=int(time.time()),
                      model=params.adapter_model or model.name, system_fingerprint=BUILD_INFO,
                      include_usage=params.include_usage, verbose=params.verbose, chat=chat,
                      protocol=protocol)


async def answer(model: ModelEndpoint, native_body: dict, kind: str,
                 chat: ChatSyntax | None = None, protocol: str = "",
                 conversation_id: str = "") -> Response:
    """Run a native body; the answer in the OpenAI ``kind`` shape, or the chat shape converted
    to ``protocol``'s (deployments/api/protocols/); a stream with a conversation id is kept
    for resuming (routes/resume.py)."""
    params, prompts = await off_loop(native.prepare, model, native_body)
    oai = context(model, kind, params, chat, protocol)
    if params.stream:
        return await native.stream(model, params, prompts, oai, conversation_id)
    status, payload = await model.shaper.complete.remote(params, prompts, oai)
    return Response(payload, status_code=status, media_type=JSON)


def _object(body) -> dict:
    if not isinstance(body, dict):
        raise invalid(f"[json.exception.type_error.304] cannot use at() with {json_type(body)}")
    return body


async def completions(ingress: IngressBase, request: Request) -> Response:
    await ingress.guard(request)
    body = _object(await read_json(request, ingress.args.max_body_bytes))
    model = await ingress.model_of(body, request)
    return await answer(model, await off_loop(completion_body, body), "text_completion",
                        conversation_id=conversation_of(request))


async def chat_completions(ingress: IngressBase, request: Request) -> Response:
    await ingress.guard(request)
    body = _object(await read_json(request, ingress.args.max_body_bytes))
    model = await ingress.model_of(body, request)
    native_body, syntax = await off_loop(chat_body, body, model)
    return await answer(model, native_body, "chat.completion", syntax,
                        conversation_id=conversation_of(request))


async def apply_template(ingress: IngressBase, request: Request) -> Response:
    await ingress.guard(request)
    body = await read_object(request, ingress.args.max_body_bytes)
    model = await ingress.model_of(body, request)
    native_body, _ = await off_loop(chat_body, body, model)
    return json_response({"prompt": native_body["prompt"]})


async def chat_input_tokens(ingress: IngressBase, request: Request) -> Response:
    """The prompt tokens a chat request would use, without running it."""
    await ingress.guard(request)
    body = await read_object(request, ingress.args.max_body_bytes)
    model = await ingress.model_of(body, request)
    return json_response({"input_tokens": await off_loop(count_input_tokens, model, body)})


def count_input_tokens(model: ModelEndpoint, chat: dict) -> int:
    """The prompt tokens of a chat body (its tools rendered), as a completion tokenizes them."""
    prompt, _ = chat_prompt(chat, model.chat, read_tools(chat).tools)
    return len(model.vocab.tokenize_prompt(prompt))
