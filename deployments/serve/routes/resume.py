"""Resumable streams' routes, as the reference answers them (server-stream.cpp): ``GET
/v1/stream?conv_id=ID&from=N``, ``POST /v1/streams/lookup``, ``DELETE /v1/stream?conv_id=ID``; and
the resumable form of a streamed completion (a request with an ``X-Conversation-Id`` header).
The sessions are deployments/serve/stream_store.py's."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

from fastapi import Request
from fastapi.responses import Response, StreamingResponse

from deployments.api.errors import ApiError, Refusal
from deployments.api.stream_sessions import CONVERSATION_HEADER, parse_lookup, parse_offset
from deployments.serve import stream_store
from deployments.serve.app import JSON, json_response, read_json
from deployments.serve.endpoint import IngressBase

SSE_HEADERS = {"X-Accel-Buffering": "no"}


def conversation_of(request: Request | None) -> str:
    """The request's ``X-Conversation-Id`` (empty when absent: the stream is not kept)."""
    return request.headers.get(CONVERSATION_HEADER, "") if request is not None else ""


async def resumable(sse: Callable[[], AsyncIterator[bytes | Refusal]], conversation_id: str
                    ) -> tuple[bytes | Refusal | None, AsyncIterator[bytes]]:
    """Open the conversation's session and start the tee: the first item (a chunk, a Refusal,
    or None for an empty stream) and the live response's chunks after it."""
    generation = await stream_store.call("open", conversation_id)
    queue = stream_store.produce(sse, conversation_id, generation)
    chunks = stream_store.drain(queue)
    return await anext(chunks, None), chunks


def _conversation(request: Request) -> str:
    conversation_id = request.query_params.get("conv_id", "")
    if not conversation_id:
        raise ApiError("Missing conversation id in path", "invalid_request_error")
    return conversation_id


async def get_stream(ingress: IngressBase, request: Request) -> Response:
    await ingress.guard(request)
    conversation_id = _conversation(request)
    dropped = await stream_store.call("dropped", conversation_id)
    if dropped is None:
        raise ApiError("Stream not found or expired", "not_found_error")
    raw = request.query_params.get("from", "")
    offset = parse_offset(raw) if raw else 0
    if offset is None:
        raise ApiError("Invalid 'from' offset", "invalid_request_error")
    if offset < dropped:
        raise ApiError("Stream offset lost, please restart", "invalid_request_error")
    return StreamingResponse(stream_store.follow(conversation_id, offset),
                             media_type="text/event-stream", headers=SSE_HEADERS)


async def lookup(ingress: IngressBase, request: Request) -> Response:
    await ingress.guard(request)
    try:
        parsed = await read_json(request, ingress.args.max_body_bytes)
    except ApiError as err:  # the reference's own envelope here: "invalid body: ...", no code
        if err.code != 400:
            raise
        return json_response({"error": {"message": f"invalid body: {err.message}",
                                        "type": "invalid_request_error"}}, 400)
    return json_response(await stream_store.call("lookup", parse_lookup(parsed)))


async def stop(ingress: IngressBase, request: Request) -> Response:
    await ingress.guard(request)
    await stream_store.call("stop", _conversation(request))
    return Response(status_code=204, media_type=JSON)
