"""OpenAI-style requests mapped onto the one native schema (deployments/api/schema.py), as the
reference
does: the chat messages are rendered into a prompt with the model's own Jinja chat template, the
OpenAI-only fields are translated or refused, and everything else is evaluated by the native field
table, so every limit and error text is shared with /completion.
"""

from __future__ import annotations

import secrets
import string
from typing import Any

from deployments.api.errors import invalid
from deployments.api.json_values import json_type, to_int
from deployments.api.tools.request import (
    chat_syntax,
    check_fields,
    constrain,
    generation_prompt,
    read_tools,
    template_kwargs,
)
from deployments.api.tools.syntax import ChatSyntax
from deployments.api.tools.template_messages import template_message

_ALNUM = string.ascii_letters + string.digits
# OpenAI request fields with no meaning here: refused by name (the reference refuses these too).
UNSUPPORTED_COMPLETION = ("best_of", "suffix")


def random_string() -> str:
    """32 random letters and digits: the reference's ids after their prefix."""
    return "".join(secrets.choice(_ALNUM) for _ in range(32))


def completion_id() -> str:
    """``chatcmpl-`` and 32 random letters and digits, for both OpenAI formats."""
    return "chatcmpl-" + random_string()


def completion_body(body: dict) -> dict:
    """/v1/completions: the native body. ``prompt`` is required; the native schema does the rest
    (``max_tokens`` and ``logprobs`` are its aliases of n_predict and n_probs)."""
    for name in UNSUPPORTED_COMPLETION:
        if name in body:
            raise invalid(f"Unsupported param: {name}")
    if body.get("echo") is True:
        raise invalid("Only no echo is supported")
    return dict(body)


def chat_body(body: dict, model) -> tuple[dict, ChatSyntax]:
    """/v1/chat/completions: the native body with the rendered prompt, and how the output is
    parsed. ``model`` is the ModelEndpoint (its chat template, vocabulary and defaults)."""
    native = {k: v for k, v in body.items() if k not in ("logprobs", "top_logprobs")}
    request = read_tools(body)
    check_fields(body, request)
    extra = template_kwargs(body, model.chat.kwargs)
    prompt, tail = chat_prompt(body, model.chat, request.tools, extra)
    native["prompt"] = prompt
    logprobs = body.get("logprobs")
    if logprobs is True:
        native["n_probs"] = _top_logprobs(body.get("top_logprobs"))
    elif body.get("top_logprobs") is not None:
        raise invalid("top_logprobs requires logprobs to be set to true")
    elif logprobs is not None and not isinstance(logprobs, bool):
        # read leniently as false (json_value), then copied on like any other key: the native
        # alias of n_probs
        native["logprobs"] = logprobs
    _check_response_format(body.get("response_format"), native)
    reasoning_format = body.get("reasoning_format", model.defaults.reasoning_format)
    syntax = chat_syntax(model.chat, request, reasoning_format if isinstance(
        reasoning_format, str) else "deepseek", "json_schema" in native, tail)
    constrain(native, syntax, request, model.special_token)
    if model.chat.thinks:  # the template's reasoning tags, over the client's
        native.update(reasoning_budget_start_tag=syntax.think_start,
                      reasoning_budget_end_tags=[syntax.think_end])
        _reasoning_budget(body, native)
        if "json_schema" not in native:
            native["generation_prompt"] = tail
    return native, syntax


def _lenient_int(body: dict, key: str, default: int) -> int:
    """json_value(body, key, default) for an int: a value that does not convert is the
    default."""
    try:
        return default if body.get(key) is None else to_int(body[key])
    except ValueError:
        return default


def _reasoning_budget(body: dict, native: dict) -> None:
    """On a template with reasoning tags, as the reference: reasoning_budget_tokens, else
    thinking_budget_tokens (what /v1/messages makes of thinking.budget_tokens), each read
    leniently; -1 or neither leaves the server's default (--reasoning-budget). The message is
    always passed on (none by default), so that an expired budget forces the end tag."""
    native.setdefault("reasoning_budget_message", "")
    budget = _lenient_int(body, "reasoning_budget_tokens",
                          _lenient_int(body, "thinking_budget_tokens", -1))
    if budget == -1:
        native.pop("reasoning_budget_tokens", None)
    else:
        native["reasoning_budget_tokens"] = budget


def _top_logprobs(value: Any) -> int:
    """json_value(body, "top_logprobs", 20): a number converts to an int (one out of its range is
    refused, naming the field), any other value is the default."""
    if not isinstance(value, (int, float)):
        return 20
    try:
        return to_int(value)
    except ValueError as exc:
        raise invalid(f"Field 'top_logprobs': {exc}") from None


def _check_response_format(fmt: Any, native: dict) -> None:
    if fmt is None:
        return
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if kind == "text":
        return
    if kind == "json_object":
        native["json_schema"] = fmt.get("schema", {"type": "object"})
    elif kind == "json_schema":
        schema = fmt.get("json_schema", {})
        native["json_schema"] = schema.get("schema", {}) if isinstance(schema, dict) else {}
    else:
        raise invalid('response_format type must be one of "text" or "json_object", but got: '
                      f"{kind}")


def chat_prompt(body: dict, chat, tools: list[dict] | None = None,
                extra: dict | None = None) -> tuple[str, str]:
    """The templated prompt of a chat body (a final assistant message is continued: prefill)
    and its generation prompt (what add_generation_prompt added, for a thinking template)."""
    if "messages" not in body:
        raise invalid("[json.exception.out_of_range.403] key 'messages' not found")
    messages = parse_messages(body["messages"], chat.object_arguments)
    add_generation_prompt = body.get("add_generation_prompt", True)
    if not isinstance(add_generation_prompt, bool):
        raise invalid("Field 'add_generation_prompt': [json.exception.type_error.302] type must "
                      f"be boolean, but is {json_type(add_generation_prompt)}")
    if extra is None:
        extra = template_kwargs(body, chat.kwargs)
    if messages and messages[-1]["role"] == "assistant" and add_generation_prompt:
        if len(messages) > 1 and messages[-2]["role"] == "assistant":
            raise invalid("Cannot have 2 or more assistant messages at the end of the list.")
        prompt = chat.render(messages[:-1], True, extra, tools) + messages[-1]["content"]
        return prompt, ""
    prompt = chat.render(messages, add_generation_prompt, extra, tools)
    tail = ""
    if chat.thinks and add_generation_prompt:
        tail = generation_prompt(chat.render, messages, extra, tools)
    return prompt, tail


def parse_messages(messages: Any, object_arguments: bool = False) -> list[dict]:
    """OpenAI messages as the template sees them: typed text parts joined by newlines, tool
    calls with their arguments as the template reads them
    (deployments/api/tools/template_messages.py)."""
    if not isinstance(messages, list):
        raise invalid(f"Expected 'messages' to be an array, got {json_type(messages)}")
    out = []
    for message in messages:
        if not isinstance(message, dict):
            raise invalid(f"Expected 'message' to be an object, got {json_type(message)}")
        role = message.get("role")
        if not isinstance(role, str):
            raise invalid("Missing 'role' in message")
        content = message.get("content")
        if content is None and "tool_calls" not in message:
            raise invalid("Expected 'content' or 'tool_calls' "
                          "(ref: https://github.com/ggml-org/llama.cpp/issues/8367)")
        out.append(template_message({**message, "role": role, "content": _text(content)},
                                    object_arguments))
    return out


def _text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise invalid(f"Invalid 'content' type: expected string or array, got {json_type(content)}")
    parts = []
    for part in content:
        if not isinstance(part, dict) or "type" not in part:
            raise invalid("Missing content part type")
        if part["type"] != "text":
            raise invalid(f"Unsupported content part type: \"{part['type']}\" (mlxray serves "
                          "text-only models)")
        text = part.get("text")
        if not isinstance(text, str):
            raise invalid("Missing text in content part")
        parts.append(text)
    return "\n".join(parts)
