"""Vertex AI's predict and health routes (deployments/api/vertex.py): each instance is sent
through this app to the route it names, as a request of its own with the predict request's
headers and query, all at once; a client that goes away stops them all."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import Response
from starlette.exceptions import HTTPException

from deployments.api import vertex
from deployments.api.errors import ApiError
from deployments.api.shapes import dumps
from deployments.serve.app import api_routes, json_response, read_json
from deployments.serve.endpoint import IngressBase

# the catch-alls that carry these routes themselves
CATCH_ALL = "/{path:path}"


def served_routes(app: FastAPI) -> dict[str, str]:
    """path -> method of every route in registration order (a path served for GET and POST,
    /props, is dispatched as its first: GET, as the reference's handler table keeps the first)."""
    routes: dict[str, str] = {}
    for prefix, route in api_routes(app.routes):
        if route.path != CATCH_ALL:
            routes.setdefault(prefix + route.path, sorted(route.methods)[0])
    return routes


def check_routes(app: FastAPI, predict_route: str | None) -> None:
    """The reference's refusal at start of a predict route that is already a route."""
    if predict_route and predict_route in served_routes(app):
        raise ValueError(f"AIP_PREDICT_ROUTE={predict_route} conflicts with an existing "
                         "llama-server route")


def is_health_route(ingress: IngressBase, path: str) -> bool:
    return bool(ingress.args.health_route) and "/" + path == ingress.args.health_route


async def predict_or_unknown(ingress: IngressBase, request: Request, path: str) -> Response:
    if not ingress.args.predict_route or "/" + path != ingress.args.predict_route:
        ingress.check_key(request)  # the reference asks for the key before it finds no route
        raise HTTPException(404)
    await ingress.guard(request)
    instances = vertex.instances_of(await read_json(request, ingress.args.max_body_bytes))
    routes = served_routes(request.app)
    aliases = vertex.alias_table(routes)
    gone = asyncio.Event()
    watcher = asyncio.create_task(_watch_disconnect(request, gone))
    try:
        predictions = await asyncio.gather(
            *(_predict(request, instance, routes, aliases, gone) for instance in instances))
    finally:
        watcher.cancel()
    return json_response({"predictions": list(predictions)})


async def _predict(request: Request, instance: Any, routes: dict[str, str],
                   aliases: dict[str, str], gone: asyncio.Event) -> Any:
    try:
        path, payload = vertex.dispatch_of(instance, aliases, routes)
        return await _call(request, routes[path], path, dumps(payload), gone)
    except ApiError as err:
        return err.body()
    except Exception as exc:  # what the route's own envelope did not take
        return vertex.server_error(str(exc) or type(exc).__name__)


async def _call(request: Request, method: str, path: str, body: bytes,
                gone: asyncio.Event) -> Any:
    """The route's answer to ``body``: its JSON, its text where it is not JSON, None when empty;
    a streamed answer is refused as the reference refuses it."""
    scope = dict(request.scope)
    root = scope.get("root_path", "")
    full = root + path if scope["path"].startswith(root) else path
    headers = [(k, v) for k, v in scope["headers"] if k not in (b"content-length", b"content-type")]
    scope.update(method=method, path=full, raw_path=full.encode(), headers=[
        *headers, (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode())])
    pending = [{"type": "http.request", "body": body, "more_body": False}]

    async def receive() -> dict:
        if pending:
            return pending.pop()
        await gone.wait()
        return {"type": "http.disconnect"}

    start: dict = {}
    parts: list[bytes] = []

    async def send(message: dict) -> None:
        if message["type"] == "http.response.start":
            start.update(message)
        elif message["type"] == "http.response.body":
            parts.append(message.get("body", b""))

    await request.app(scope, receive, send)
    kinds = dict(start.get("headers", [])).get(b"content-type", b"")
    if kinds.startswith(b"text/event-stream"):
        raise ApiError("predict route does not support streaming responses")
    data = b"".join(parts)
    if not data:
        return None
    try:
        return json.loads(data)
    except ValueError:
        return data.decode("utf-8", "replace")


async def _watch_disconnect(request: Request, gone: asyncio.Event) -> None:
    while not await request.is_disconnected():
        await asyncio.sleep(0.25)
    gone.set()
