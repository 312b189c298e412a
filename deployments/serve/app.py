"""The FastAPI app every route module registers on, its error handlers and response helpers."""

import asyncio
import json
import logging
import re
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from fastapi import FastAPI, Request
from fastapi.responses import Response
from fastapi.routing import APIRoute
from starlette.exceptions import HTTPException as StarletteHTTPException

from deployments.api.cors import CorsPolicy
from deployments.api.errors import ApiError, invalid
from deployments.api.shapes import dumps, sse
from deployments.serve.failures import from_failure
from deployments.serve.model_router import HELD
from engine.types import EngineError

JSON = "application/json; charset=utf-8"
log = logging.getLogger("mlxray.ingress")
T = TypeVar("T")

app = FastAPI(title="mlxray", description="llama-server's HTTP API on MLX and Ray Serve",
              docs_url=None, redoc_url=None)


async def off_loop(work: Callable[..., T], *args: Any) -> T:
    """``work(*args)`` on a worker thread: tokenizing, templating or turning a schema into a
    grammar takes seconds for a large body, and the event loop answers every other client
    (``/health`` among them) meanwhile. The tokenizer lets go of the GIL as it works
    (engine/vocab.py); what ``work`` raises is raised here."""
    return await asyncio.to_thread(work, *args)


def json_response(body: Any, status: int = 200) -> Response:
    return Response(dumps(body), status_code=status, media_type=JSON)


def error_response(err: ApiError) -> Response:
    return Response(dumps(err.body()), status_code=err.code, media_type=JSON)


class EnvelopeOnFailure:
    """ASGI middleware: an exception no handler took (a replica that died, a bug) still answers
    with the error envelope: a JSON error before the response has started, else a final SSE
    error frame; never a bare 500 page or a connection cut without a word."""

    def __init__(self, inner: Any):
        self.inner = inner

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await self.inner(scope, receive, send)
        started = False

        async def tracking_send(message: dict) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.inner(scope, receive, tracking_send)
        except Exception as exc:
            log.exception("unhandled failure on %s", scope.get("path"))
            err = from_failure(exc)
            if not started:
                await send({"type": "http.response.start", "status": err.code,
                            "headers": [(b"content-type", JSON.encode())]})
                await send({"type": "http.response.body", "body": dumps(err.body())})
            else:
                await send({"type": "http.response.body", "body": sse(err.body())})


class ReleaseHeldModels:
    """ASGI middleware: the router-mode models a request holds (deployments/serve/
    model_router.py) are released once its answer has been sent, or its client went away."""

    def __init__(self, inner: Any):
        self.inner = inner

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await self.inner(scope, receive, send)
        held: list[Callable[[], None]] = []
        token = HELD.set(held)
        try:
            await self.inner(scope, receive, send)
        finally:
            HELD.reset(token)
            for release in held:
                release()


app.add_middleware(EnvelopeOnFailure)
app.add_middleware(ReleaseHeldModels)


@app.exception_handler(ApiError)
async def _api_error(request: Request, err: ApiError) -> Response:
    return error_response(err)


@app.exception_handler(StarletteHTTPException)
async def _http_error(request: Request, exc: StarletteHTTPException) -> Response:
    if exc.status_code in (404, 405):
        return error_response(ApiError("File Not Found", "not_found_error", middleware=True))
    return error_response(ApiError(str(exc.detail), "invalid_request_error", exc.status_code))


def from_engine(exc: EngineError) -> ApiError:
    return ApiError(exc.message, exc.type, exc.code, dict(exc.extra))


def too_large(size: int, limit: int) -> ApiError:
    return ApiError(f"request body too large: {size} bytes (limit {limit})",
                    "invalid_request_error", 413)


async def read_body(request: Request, limit: int) -> bytes:
    """The raw body, refused with 413 as soon as it is known to pass ``limit`` bytes: from its
    Content-Length before reading, else while it streams in, so it is never held whole."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise too_large(int(declared), limit)
    parts, size = [], 0
    async for part in request.stream():
        size += len(part)
        if size > limit:
            raise too_large(size, limit)
        parts.append(part)
    return b"".join(parts)


# a UTF-16 surrogate escape: JSON may spell one that has no valid UTF-8 form
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")


# a body past this size is decoded on a worker thread (a 16 MiB one takes a second or more)
DECODE_OFF_LOOP_BYTES = 64 * 1024


async def read_json(request: Request, limit: int) -> Any:
    """The body as JSON, decoded off the event loop when it is large, so that other clients
    (``/health`` among them) are answered meanwhile (issue #28)."""
    body = await read_body(request, limit)
    if len(body) > DECODE_OFF_LOOP_BYTES:
        return await off_loop(decode_json, body)
    return decode_json(body)


def decode_json(body: bytes) -> Any:
    """A body that is not JSON is a 400 here (the reference answers 500), and so are what the
    reference's parser refuses too: nesting deeper than Python can walk and unpaired surrogates
    (\\udc80), which have no UTF-8 form."""
    try:
        value = json.loads(body, parse_constant=_no_constant)
        if _SURROGATE_ESCAPE.search(body):
            json.dumps(value, ensure_ascii=False).encode("utf-8")
        return value
    except (ValueError, RecursionError) as exc:  # JSONDecodeError and UnicodeError among them
        line, col = (exc.lineno, exc.colno) if isinstance(exc, json.JSONDecodeError) else (1, 1)
        raise invalid(f"[json.exception.parse_error.101] parse error at line {line}, column {col}: "
                      f"syntax error while parsing value - {_describe(exc)}") from None


def _no_constant(name: str) -> Any:
    """NaN, Infinity and -Infinity are not JSON: the reference's parser refuses them too."""
    raise ValueError(f"invalid literal: {name}")


def _describe(exc: Exception) -> str:
    if isinstance(exc, RecursionError):
        return "nesting too deep"
    if isinstance(exc, UnicodeEncodeError):
        return "invalid string: unpaired UTF-16 surrogate"
    if isinstance(exc, UnicodeDecodeError):
        return "invalid UTF-8 byte"
    return str(exc)


async def read_object(request: Request, limit: int) -> dict:
    body = await read_json(request, limit)
    if not isinstance(body, dict):
        raise invalid("request body must be a JSON object")
    return body


class CorsMiddleware:
    """llama-server's CORS (deployments/api/cors.py, --cors-*): every answer carries the
    Allow-Origin the policy gives; an OPTIONS preflight is a blank 200 before any guard (browsers
    send no Authorization header with it). The policy is the application's, set by its ingress
    (``use``): one per process, as Serve runs one ingress replica per process."""

    policy = CorsPolicy()

    def __init__(self, inner):
        self.inner = inner

    @classmethod
    def use(cls, policy: CorsPolicy) -> None:
        cls.policy = policy

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.inner(scope, receive, send)
        headers = dict(scope.get("headers") or [])
        origin = headers.get(b"origin", b"")
        policy = self.policy
        if scope["method"] == "OPTIONS":
            await send({"type": "http.response.start", "status": 200, "headers": [
                *policy.answer_headers(origin, preflight=True),
                (b"content-type", b"text/html"),
                (b"content-length", b"0"),
            ]})
            await send({"type": "http.response.body", "body": b""})
            return None
        allow = policy.answer_headers(origin, preflight=False)

        async def send_with_origin(message):
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), *allow]}
            await send(message)

        return await self.inner(scope, receive, send_with_origin)


app.add_middleware(CorsMiddleware)


def api_routes(routes: list, prefix: str = "") -> Iterator[tuple[str, APIRoute]]:
    """(path prefix, route) of every APIRoute in order, those of included routers too (Ray
    Serve's ``serve.ingress`` re-mounts the class's routes as a router)."""
    for route in routes:
        if isinstance(route, APIRoute):
            yield prefix, route
        elif getattr(route, "original_router", None) is not None:
            context = getattr(route, "include_context", None)
            yield from api_routes(route.original_router.routes,
                                  prefix + getattr(context, "prefix", ""))
