"""Chat messages as llama-server hands them to the template (spec §1, "Feeding messages"):
``developer`` is ``system``; an assistant's ``tool_calls`` are checked and their arguments
given as the template reads them (an object for a template that applies ``tojson`` to them, a
JSON string otherwise); ``reasoning_content`` is also ``thinking`` (GPT-OSS's name); a tool
message keeps its ``tool_call_id`` and ``name``."""

from __future__ import annotations

import json
from typing import Any

from deployments.api.errors import ApiError, invalid


def template_message(message: dict, object_arguments: bool) -> dict:
    out = dict(message)
    if out["role"] == "developer":
        out["role"] = "system"
    if out.get("reasoning_content") is not None and "thinking" not in out:
        out["thinking"] = out["reasoning_content"]
    calls = out.get("tool_calls")
    if calls is not None:
        if out["role"] != "assistant":
            raise invalid("Only assistant messages can have 'tool_calls'")
        if not isinstance(calls, list):
            raise invalid("Expected 'tool_calls' to be an array")
        out["tool_calls"] = [_tool_call(c, object_arguments) for c in calls]
    return out


def _tool_call(call: Any, object_arguments: bool) -> dict:
    if not isinstance(call, dict) or call.get("type") != "function":
        raise invalid("Tool call must have type 'function'")
    function = call.get("function")
    if not isinstance(function, dict) or not isinstance(function.get("name"), str):
        raise invalid("Tool call must have a function with a 'name'")
    if "arguments" not in function:
        raise invalid("Tool call function must have 'arguments'")
    arguments = function["arguments"]
    if object_arguments and isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except ValueError as exc:
            raise ApiError(f"Failed to parse tool call arguments as JSON: {exc}",
                           "server_error") from None
    elif not object_arguments and not isinstance(arguments, str):
        arguments = json.dumps(arguments, ensure_ascii=False)
    out = {"type": "function", "function": {"name": function["name"], "arguments": arguments}}
    if "id" in call:
        out["id"] = call["id"]
    return out
