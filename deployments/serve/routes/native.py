"""The native llama-server routes: /completion(s), /tokenize, /detokenize, /health.

Handlers take the ingress (its state and guards) as their first argument; the route table is in
deployments/serve/ingress.py.
"""

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from fastapi import Request
from fastapi.responses import Response, StreamingResponse
from ray.exceptions import RayError

from deployments.api.errors import ApiError, Refusal, RequestError, invalid
from deployments.api.json_values import json_type
from deployments.api.schema import CompletionParams, parse_completion, split_prompts
from deployments.api.shapes import OaiContext
from deployments.serve.app import (
    JSON,
    from_engine,
    json_response,
    off_loop,
    read_json,
    read_object,
)
from deployments.serve.endpoint import IngressBase, ModelEndpoint
from deployments.serve.routes import resume
from deployments.serve.routes.resume import conversation_of
from deployments.serve.streams import close
from engine.checks import check_prompt, check_queue_room
from engine.types import EngineError
from engine.vocab import Vocab

HEALTH_TIMEOUT_S = 5.0


def _flag(body: dict, key: str, default: bool) -> bool:
    value = body.get(key, default)
    return value if isinstance(value, bool) else default


async def _with_pings(first, chunks, interval: int) -> AsyncIterator[bytes]:
    """The SSE body; a ``:`` comment line after ``interval`` seconds of silence keeps it open.
    A client that goes away mid-stream cancels the shaper's stream (and so the replica's)."""
    iterator = chunks.__aiter__()
    pending: asyncio.Future | None = None
    finished = False
    try:
        if first is not None:
            yield first
        while True:
            if pending is None:
                pending = asyncio.ensure_future(anext(iterator, None))
            if interval > 0:
                done, _ = await asyncio.wait({pending}, timeout=interval)
                if not done:
                    yield b":\n\n"
                    continue
            chunk = await pending
            pending = None
            if chunk is None:
                finished = True
                return
            yield chunk
    finally:
        if pending is not None and not pending.done():
            pending.cancel()  # thrown into the upstream at its await: it ends and cancels its own
        elif not finished:
            await close(chunks)

# ---- completion ----------------------------------------------------------------------------
async def completion(ingress: IngressBase, request: Request) -> Response:
    await ingress.guard(request)
    body = await read_json(request, ingress.args.max_body_bytes)
    model = await ingress.model_of(body, request)
    params, prompts = await off_loop(prepare, model, body)
    return await answer(model, params, prompts, request)


async def answer(model: ModelEndpoint, params: CompletionParams, prompts: list[list[int]],
                 request: Request) -> Response:
    """A prepared completion's response: SSE when it streams, else the shaper's JSON."""
    if params.stream:
        return await stream(model, params, prompts, conversation_id=conversation_of(request))
    status, payload = await model.shaper.complete.remote(params, prompts)
    return Response(payload, status_code=status, media_type=JSON)


def prepare(model: ModelEndpoint, body: Any) -> tuple[CompletionParams, list[list[int]]]:
    """The reference's order: prompt present, tokenized, fields evaluated, then slot checks.
    Seconds of work for a large body: the routes run it off the event loop (``off_loop``).
    More prompts than one replica's slots and queue can take are refused before any is
    tokenized, with the full queue's 503 (the reference queues without bound)."""
    if not isinstance(body, dict):
        raise invalid(f"[json.exception.type_error.304] cannot use at() with {json_type(body)}")
    capacity = model.args.n_parallel + model.args.max_queue
    try:
        texts = split_prompts(body)
        check_queue_room(len(texts), 0, capacity)
        prompts = [model.vocab.tokenize_prompt(p) for p in texts]
        params = parse_completion(body, model.parse_context, model.defaults)
        check_queue_room(len(prompts) * params.n_cmpl, 0, capacity)
        if model.adapters:
            model.adapters.resolve(params, body.get("model"))
        for tokens in prompts:
            check_prompt(tokens, model.vocab.n_vocab, model.args.n_ctx)
    except EngineError as exc:
        raise from_engine(exc) from None
    return params, prompts


async def stream(model: ModelEndpoint, params: CompletionParams, prompts: list[list[int]],
                 oai: OaiContext | None = None, conversation_id: str = "") -> Response:
    """SSE, or the JSON of a refusal. With a conversation id (the X-Conversation-Id header) the
    stream is kept for GET /v1/stream (routes/resume.py) and outlives the client."""
    if conversation_id:
        first, chunks = await resume.resumable(lambda: model.sse(params, prompts, oai),
                                               conversation_id)
    else:
        chunks = model.sse(params, prompts, oai)
        try:
            first = await anext(chunks, None)
        except BaseException:  # the client left (or the shaper failed) before the first frame
            await close(chunks)
            raise
    if isinstance(first, Refusal):
        async for _ in chunks:  # nothing follows a refusal: the shaper's call just ends
            pass
        return Response(first.body, status_code=first.status, media_type=JSON)
    return StreamingResponse(
        _with_pings(first, chunks, params.sse_ping_interval),
        media_type="text/event-stream",
        headers={"X-Accel-Buffering": "no"},
    )

# ---- Python handle API ---------------------------------------------------------------------
def handle_body(body: Any, stream: bool) -> Any:
    """The body a handle method validates: ``stream`` is implied by the method called, so a body
    asking for the other one is refused rather than silently answered the wrong way."""
    if not isinstance(body, dict) or "stream" not in body:
        return {**body, "stream": stream} if isinstance(body, dict) else body
    if body["stream"] is not stream and isinstance(body["stream"], bool):
        method = "options(stream=True).stream" if body["stream"] else "complete"
        raise invalid(f"\"stream\": {str(body['stream']).lower()} needs handle.{method}")
    return body


async def _prepare_handle(ingress: IngressBase, body: Any, stream: bool):
    """A handle call's body validated as the HTTP route validates it; errors raise
    RequestError."""
    try:
        await ingress.check_ready()
        model = await ingress.model_of(body)
        return (model, *await off_loop(prepare, model, handle_body(body, stream)))
    except ApiError as err:
        raise RequestError.from_api_error(err) from None


async def complete_handle(ingress: IngressBase, body: Any) -> Any:
    """handle.complete.remote(body): the native answer as a dict (a list for several prompts or
    n_cmpl > 1), validated as POST /completion validates it; errors raise RequestError."""
    return await handle_result(*await _prepare_handle(ingress, body, stream=False))


async def handle_result(model: ModelEndpoint, params: CompletionParams,
                        prompts: list[list[int]], oai: OaiContext | None = None) -> Any:
    """The shaper's answer for a handle caller; an error answer raises RequestError."""
    status, result = await model.shaper.result.remote(params, prompts, oai)
    if status != 200:
        raise RequestError(status, result)
    return result


async def stream_handle(ingress: IngressBase, body: Any) -> AsyncIterator[dict]:
    """handle.options(stream=True).stream.remote(body): the native stream frames as dicts; an
    error (before or after the first frame) raises RequestError."""
    async for frame in handle_frames(*await _prepare_handle(ingress, body, stream=True)):
        yield frame


async def handle_frames(model: ModelEndpoint, params: CompletionParams,
                        prompts: list[list[int]],
                        oai: OaiContext | None = None) -> AsyncIterator[dict]:
    """The shaper's stream frames for a handle caller; an error frame raises RequestError."""
    async for batch in model.shaper.options(stream=True).frames.remote(params, prompts, oai):
        for frame in batch:
            error = frame.get("error")
            if error is not None:
                raise RequestError(error["code"], frame)
            yield frame

# ---- tokens --------------------------------------------------------------------------------
async def tokenize(ingress: IngressBase, request: Request) -> Response:
    await ingress.guard(request)
    body = await read_object(request, ingress.args.max_body_bytes)
    vocab = (await ingress.model_of(body, request)).vocab
    return json_response(await off_loop(_tokens, vocab, body))


def _tokens(vocab: Vocab, body: dict) -> dict:
    """/tokenize's answer."""
    content = body.get("content")
    add_special = _flag(body, "add_special", False)
    parse_special = _flag(body, "parse_special", True)
    with_pieces = _flag(body, "with_pieces", False)
    if content is None:
        return {"tokens": []}
    try:
        if isinstance(content, str):
            tokens = vocab.tokenize(content, add_special, parse_special)
        elif isinstance(content, list):
            tokens = vocab.tokenize_mixed(content, add_special, parse_special)
        else:
            raise invalid("\"content\" must be a string or an array of strings and tokens")
    except EngineError as exc:
        raise invalid(exc.message) from None
    if not with_pieces:
        return {"tokens": tokens}
    out = []
    for t in tokens:
        piece = vocab.piece(t, special=True)
        try:
            shown: Any = piece.decode("utf-8")
        except UnicodeDecodeError:
            shown = list(piece)
        out.append({"id": t, "piece": shown})
    return {"tokens": out}


async def detokenize(ingress: IngressBase, request: Request) -> Response:
    await ingress.guard(request)
    body = await read_object(request, ingress.args.max_body_bytes)
    vocab = (await ingress.model_of(body, request)).vocab
    return json_response({"content": await off_loop(_content, vocab, body)})


def _content(vocab: Vocab, body: dict) -> str:
    """/detokenize's text."""
    tokens = body.get("tokens", [])
    if tokens is None:
        tokens = []
    if not isinstance(tokens, list) or not all(
        isinstance(t, int) and not isinstance(t, bool) for t in tokens
    ):
        raise invalid("\"tokens\" must be an array of integers")
    return vocab.detokenize(tokens, special=True)

# ---- health --------------------------------------------------------------------------------
async def _all_ready(ingress: IngressBase) -> bool:
    return all([await model.replica.ready.remote() for model in ingress.models])


async def health(ingress: IngressBase, request: Request) -> Response:
    """Asks every model's replicas every time (a restarted one is loading again); 503 until
    each model has one that answers."""
    try:
        ready = await asyncio.wait_for(_all_ready(ingress), HEALTH_TIMEOUT_S)
    except (asyncio.TimeoutError, RayError):
        ready = False
    if not ready:
        raise ApiError("Loading model", "unavailable_error", middleware=True)
    return json_response({"status": "ok"})
