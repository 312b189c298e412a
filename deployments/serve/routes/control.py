"""``POST /v1/chat/completions/control``: ``{"id": "<completion id>", "action": "reasoning_end"}``
ends the reasoning of a running completion (its budget is spent at once: the reasoning budget
message and end tag are forced next), as the reference's ``post_control`` does, with its answers:
``{"success": true}``, ``{"success": false, "message": ...}`` (200) or a 400 for a missing id or
an unknown action. The completion is looked for on each of the model's replicas."""

from __future__ import annotations

from typing import Any

from fastapi import Request
from fastapi.responses import Response

from deployments.api.errors import invalid
from deployments.serve.app import json_response, read_json
from deployments.serve.endpoint import IngressBase, ModelEndpoint

ACTIONS = ("reasoning_end",)


def _string(body: Any, key: str) -> str:
    """json_value(body, key, std::string()): the default for a missing key or another type."""
    value = body.get(key) if isinstance(body, dict) else None
    return value if isinstance(value, str) else ""


async def control(ingress: IngressBase, request: Request) -> Response:
    await ingress.guard(request)
    body = await read_json(request, ingress.args.max_body_bytes)
    completion_id, action = _string(body, "id"), _string(body, "action")
    if not completion_id:
        raise invalid("missing completion id")
    if action not in ACTIONS:
        raise invalid("unknown control action")
    return json_response(await _ask(ingress.model_of(body, request), completion_id))


async def _ask(model: ModelEndpoint, completion_id: str) -> dict:
    return await model.replica.control.remote(completion_id)
