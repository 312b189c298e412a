"""Router mode's own routes (``--models-dir``): POST /models/load and /models/unload, GET
/models/sse and the router's GET /props; the other routes load the model they name first
(deployments/serve/endpoint.py ``model_of``)."""

from __future__ import annotations

from fastapi import Request
from fastapi.responses import Response, StreamingResponse

from deployments.api import router_models
from deployments.api.build_info import BUILD_INFO
from deployments.api.errors import ApiError, invalid
from deployments.serve.app import json_response, read_object
from deployments.serve.endpoint import IngressBase
from deployments.serve.model_router import ModelRouter

NOT_FOUND = "model is not found"


def _router(ingress: IngressBase) -> ModelRouter:
    """The router; outside router mode these routes do not exist (404), as in the reference."""
    if ingress.router is None:
        raise ApiError("File Not Found", "not_found_error", middleware=True)
    return ingress.router


async def _named(ingress: IngressBase, request: Request) -> tuple[ModelRouter, str]:
    ingress.check_key(request)
    router = _router(ingress)
    body = await read_object(request, ingress.args.max_body_bytes)
    name = body.get("model")
    if not isinstance(name, str):
        return router, ""
    model = ingress.by_name.get(name)  # a model's name or alias: the model's name
    return router, model.name if model else name


async def load(ingress: IngressBase, request: Request) -> Response:
    router, name = await _named(ingress, request)
    state = router.states.get(name)
    if state is None:
        raise ApiError(NOT_FOUND, "not_found_error")
    if state.running:
        raise invalid("model is already running")
    router.load(name)
    return json_response({"success": True})


async def unload(ingress: IngressBase, request: Request) -> Response:
    router, name = await _named(ingress, request)
    state = router.states.get(name)
    if state is None:
        raise invalid(NOT_FOUND)
    if not state.running:
        raise invalid("model is not running")
    router.unload(name)
    return json_response({"success": True})


async def events(ingress: IngressBase, request: Request) -> Response:
    """Every status change from now on, one ``data:`` frame each, until the client goes."""
    ingress.check_key(request)
    router = _router(ingress)

    async def frames():
        async for item in router.events():
            yield router_models.sse_frame(item)

    return StreamingResponse(frames(), media_type="text/event-stream")


def props(ingress: IngressBase) -> Response:
    """GET /props without ``?model=``: the router's own (with it, the model's)."""
    args = ingress.args
    return json_response({
        "role": "router",
        "max_instances": args.models_max,
        "models_autoload": args.models_autoload,
        "model_alias": "llama-server",
        "model_path": "none",
        "default_generation_settings": {"params": {}, "n_ctx": 0},
        "ui_settings": {},
        "build_info": BUILD_INFO,
        "cors_proxy_enabled": False,
    })
