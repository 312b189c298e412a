"""The FastAPI app every route module registers on, its error handlers and response helpers."""

import json
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from engine.types import EngineError

from .errors import ApiError, invalid
from .shapes import dumps

JSON = "application/json; charset=utf-8"

app = FastAPI(title="mlxray", description="llama-server's HTTP API on MLX and Ray Serve",
              docs_url=None, redoc_url=None)


def json_response(body: Any, status: int = 200) -> Response:
    return Response(dumps(body), status_code=status, media_type=JSON)


def error_response(err: ApiError) -> Response:
    return Response(dumps(err.body()), status_code=err.code, media_type=JSON)


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


async def read_json(request: Request, limit: int) -> Any:
    """The body as JSON. A body that is not JSON is a 400 here (the reference answers 500)."""
    body = await request.body()
    if len(body) > limit:
        raise ApiError(f"request body too large: {len(body)} bytes (limit {limit})",
                       "invalid_request_error", 413)
    try:
        return json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        line, col = (exc.lineno, exc.colno) if isinstance(exc, json.JSONDecodeError) else (1, 1)
        raise invalid(f"[json.exception.parse_error.101] parse error at line {line}, column {col}: "
                      f"syntax error while parsing value - {exc}") from None


async def read_object(request: Request, limit: int) -> dict:
    body = await read_json(request, limit)
    if not isinstance(body, dict):
        raise invalid("request body must be a JSON object")
    return body


class CorsMiddleware:
    """llama-server's CORS: every answer echoes the request's Origin; an OPTIONS preflight is a
    blank 200 before any guard (browsers send no Authorization header with it)."""

    def __init__(self, inner):
        self.inner = inner

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.inner(scope, receive, send)
        headers = dict(scope.get("headers") or [])
        origin = headers.get(b"origin", b"")
        if scope["method"] == "OPTIONS":
            await send({"type": "http.response.start", "status": 200, "headers": [
                (b"access-control-allow-origin", origin),
                (b"access-control-allow-credentials", b"true"),
                (b"access-control-allow-methods", b"GET, POST"),
                (b"access-control-allow-headers", b"*"),
                (b"content-type", b"text/html"),
                (b"content-length", b"0"),
            ]})
            await send({"type": "http.response.body", "body": b""})
            return None

        async def send_with_origin(message):
            if message["type"] == "http.response.start":
                message = {**message, "headers": [
                    *message.get("headers", []), (b"access-control-allow-origin", origin)]}
            await send(message)

        return await self.inner(scope, receive, send_with_origin)


app.add_middleware(CorsMiddleware)
