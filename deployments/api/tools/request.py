"""The chat request's tool and reasoning fields, read as llama-server b10621 reads them (spec §1):
``tools``, ``tool_choice``, ``parallel_tool_calls``, ``reasoning_format``,
``chat_template_kwargs`` (``enable_thinking``), ``reasoning_effort``, and what they make of the
native request (the tool-call grammar, its triggers and preserved tokens, the reasoning tags)
and of the answer (the ``ChatSyntax`` the shaper parses the output with).

mlxray's own behaviour (the compat manifest's additions): a named ``tool_choice`` object is
enforced (the reference treats it as ``auto``), and ``required`` constrains from the first
token, so the call cannot be preceded by prose (the reference lets any text come first).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from deployments.api.errors import ApiError, invalid
from deployments.api.json_values import json_type
from deployments.api.tools.grammars import SpecialToken, tool_constraint
from deployments.api.tools.syntax import CONTENT, DEEPSEEK_R1, GPT_OSS, ChatSyntax

CHOICES = ("auto", "none", "required")


@dataclass
class ToolRequest:
    """What the request's tool fields say."""

    tools: list[dict]  # the OpenAI tools as the template sees them
    declared: list[dict]  # {"name", "parameters"} of each
    choice: str  # auto, none, required, or "function" (a named one)
    named: str = ""
    parallel: bool = True


def _tools_error(message: str, tools: Any) -> ApiError:
    dump = json.dumps(tools, indent=4, ensure_ascii=False)
    return ApiError(f"Failed to parse tools: {message}; tools = {dump}", "server_error")


def parse_tools(value: Any) -> list[dict]:
    """``tools`` as common_chat_tools_parse_oaicompat reads it: a 500 for anything malformed."""
    if not isinstance(value, list):
        raise _tools_error(f"Expected 'tools' to be an array, got {_dump(value)}", value)
    declared = []
    for tool in value:
        if not isinstance(tool, dict) or "type" not in tool:
            raise _tools_error(f"Missing tool type: {_dump(tool)}", value)
        if tool["type"] != "function":
            raise _tools_error(f"Unsupported tool type: {_dump(tool)}", value)
        function = tool.get("function")
        if not isinstance(function, dict):
            raise _tools_error(f"Missing tool function: {_dump(tool)}", value)
        if "name" not in function:
            raise _tools_error("[json.exception.out_of_range.403] key 'name' not found", value)
        declared.append({"name": function["name"],
                         "description": function.get("description", ""),
                         "parameters": function.get("parameters", {})})
    return declared


def _dump(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def read_tools(body: dict) -> ToolRequest:
    raw = body.get("tools")
    declared = parse_tools(raw) if raw is not None and raw != [] else []
    # rebuilt from what was parsed, as the reference renders them: other keys (strict) dropped
    tools = [{"type": "function", "function": tool} for tool in declared]
    choice, named = _tool_choice(body.get("tool_choice", "auto"), declared)
    parallel = body.get("parallel_tool_calls", True)
    return ToolRequest(tools, declared, choice, named,
                       parallel if isinstance(parallel, bool) else True)


def _tool_choice(value: Any, declared: list[dict]) -> tuple[str, str]:
    if isinstance(value, str):
        if value not in CHOICES:
            raise invalid(f"Invalid tool_choice: {value}")
        return value, ""
    if isinstance(value, dict) and value.get("type") == "function":
        function = value.get("function")
        name = function.get("name") if isinstance(function, dict) else None
        if not isinstance(name, str):
            raise invalid("Invalid tool_choice: a named function needs function.name")
        if declared and not any(t["name"] == name for t in declared):
            raise invalid(f"Invalid tool_choice: function '{name}' is not one of the tools")
        return "function", name
    return "auto", ""  # other types: json_value's default, as the reference


def template_kwargs(body: dict, defaults: dict | None = None) -> dict:
    """The template's extra variables: chat_template_kwargs over the server's (``defaults``,
    --chat-template-kwargs), enable_thinking (always passed), reasoning_effort."""
    extra = body.get("chat_template_kwargs") or {}
    if not isinstance(extra, dict):
        raise invalid("\"chat_template_kwargs\" must be an object")
    extra = {**(defaults or {}), **extra}
    thinking = extra.get("enable_thinking", True)
    if not isinstance(thinking, bool):
        raise invalid("invalid type for \"enable_thinking\" (expected boolean, got "
                      f"{json_type(thinking)})")
    effort = body.get("reasoning_effort")
    if effort == "none":
        thinking = False
    elif isinstance(effort, str):
        extra.update(reasoning_effort=effort, reasoning_strength=effort)
    extra["enable_thinking"] = thinking
    return extra


def check_fields(body: dict, request: ToolRequest) -> None:
    """The refusals that depend on tools being given."""
    if not request.declared:
        return
    if request.choice != "none" and body.get("grammar") is not None:
        raise invalid("Cannot use custom grammar constraints with tools.")
    if body.get("logprobs") is True and body.get("stream") is True:
        raise invalid("logprobs is not supported with tools + stream")


def generation_prompt(render, messages: list[dict], extra: dict, tools: list[dict]) -> str:
    """What add_generation_prompt adds: the template rendered both ways, the differing tail."""
    without = render(messages, False, extra, tools)
    with_it = render(messages, True, extra, tools)
    common = 0
    for a, b in zip(without, with_it):
        if a != b:
            break
        common += 1
    return with_it[common:]


def chat_syntax(template, request: ToolRequest, reasoning_format: str, json_schema: bool,
                prompt_tail: str) -> ChatSyntax:
    fmt = template.format if request.declared or template.format == GPT_OSS else CONTENT
    reasoning = template.thinks and reasoning_format != "none"
    start, end = getattr(template, "think_tags", None) or ("<think>", "</think>")
    opened = prompt_tail.rfind(start) > prompt_tail.rfind(end)
    return ChatSyntax(
        format=fmt, tools=tuple(request.declared),
        parse_tools=(bool(request.declared) and request.choice != "none" and not json_schema
                     and fmt != CONTENT),
        json_only=bool(request.declared) and request.choice != "none" and json_schema,
        thinks=template.thinks,
        reasoning=reasoning or (fmt == GPT_OSS and reasoning_format != "none"),
        think_start=start, think_end=end, in_reasoning=reasoning and opened,
        trim=template.format != DEEPSEEK_R1)


def constrain(native: dict, syntax: ChatSyntax, request: ToolRequest,
              special: SpecialToken) -> None:
    """The grammar fields of the native request (the reference sets them from the template,
    over whatever the client sent)."""
    tools = request.declared
    if request.choice == "function":
        tools = [t for t in tools if t["name"] == request.named]
    lazy = request.choice == "auto"
    parallel = request.parallel and request.choice != "function"
    made = tool_constraint(syntax, tools if syntax.parse_tools else [], lazy, parallel, special)
    if made.grammar:
        native["grammar"] = made.grammar
    native.update(grammar_lazy=made.lazy, grammar_triggers=made.triggers,
                  preserved_tokens=made.preserved)
