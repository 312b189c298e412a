"""``POST /v1/chat/completions/control``: ``{"id": "<completion id>", "action": "reasoning_end"}``
ends the reasoning of a running completion (its budget is spent at once: the reasoning budget
message and end tag are forced next), as the reference's ``post_control`` does, with its answers:
``{"success": true}``, ``{"success": false, "message": ...}`` (200) or a 400 for a missing id or
an unknown action. The completion is looked for on each of the model's live replicas."""

from __future__ import annotations

from typing import Any

from fastapi import Request
from fastapi.responses import Response

from deployments.api.errors import invalid
from deployments.serve import replicas
from deployments.serve.app import json_response, read_json
from deployments.serve.endpoint import IngressBase, ModelEndpoint
from engine.control import NO_COMPLETION, NOT_ARMED

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
    return json_response(await _ask(ingress, await ingress.model_of(body, request), completion_id))


async def _ask(ingress: IngressBase, model: ModelEndpoint, completion_id: str) -> dict:
    """Every live replica of the model is asked (deployments/serve/replicas.py): the one running
    the completion answers for it; if none runs it, the reference's "no active completion"."""
    answers = [a.answer for a in await replicas.ask_each(model, ingress.board, "control",
                                                         completion_id)]
    return next((a for a in answers if a.get("success")), None) or next(
        (a for a in answers if a.get("message") == NOT_ARMED), None) or {
        "success": False, "message": NO_COMPLETION}
