"""GET and POST /lora-adapters: one model's LoRA adapters (the ``model`` query parameter picks
the model, the first by default), as llama-server lists and rescales them."""

from __future__ import annotations

from fastapi import Request
from fastapi.responses import Response

from deployments.serve.app import json_response, read_json
from deployments.serve.endpoint import IngressBase


async def list_adapters(ingress: IngressBase, request: Request) -> Response:
    await ingress.guard(request)
    return json_response((await ingress.model_of(None, request)).adapters.listing())


async def set_scales(ingress: IngressBase, request: Request) -> Response:
    """The global scales of every adapter: the listed ones, the others 0. Requests without a
    ``lora`` list run with them, on every replica."""
    await ingress.guard(request)
    body = await read_json(request, ingress.args.max_body_bytes)
    (await ingress.model_of(None, request)).adapters.set_scales(body)
    return json_response({"success": True})
