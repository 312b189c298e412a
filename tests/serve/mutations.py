"""Seeded mutations of a recorded agent request (issue #27): one request body in, a variant out,
each with one to three edits at random places of its JSON tree: a key dropped, added or copied to
a sibling, a value of another type (string, number, null, list, object), an empty or huge or
negative value, unicode, deep nesting, an unknown or misplaced content block (images, tool
results, tool calls), a tool schema with odd JSON-schema keywords, a tool_choice variant, and the
request cut down to its last message (so some variants fit the test graph's small context and
generate). The number of tokens to generate is kept small so generation ends fast."""

from __future__ import annotations

import copy
import random
from typing import Any

Path = tuple[Any, ...]

ODD_VALUES: list[Any] = [
    None, True, False, 0, -1, 1.5, -(2**63), 2**64, 10**30, 1e308, -1e-308, "", " ", "0", "-1",
    "null", "ünïcødé 😀 \u202e\u0000", "\ud7ff\ue000", [], {}, [None], [[]], [{}], {"": None},
]
BLOCK_TYPES = ["text", "image", "tool_use", "tool_result", "thinking", "redacted_thinking",
               "document", "server_tool_use", "web_search_tool_result", "input_text",
               "output_text", "input_image", "input_file", "function_call",
               "function_call_output", "reasoning", "message", "refusal", "bogus", ""]
ODD_BLOCKS: list[Any] = [
    {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBO"}},
    {"type": "image", "source": {"type": "url", "url": "http://x/y.png"}},
    {"type": "image", "source": None},
    {"type": "input_image", "image_url": "data:image/png;base64,iVBO"},
    {"type": "tool_result", "tool_use_id": "t1", "content": [{"type": "text", "text": "ok"}]},
    {"type": "tool_result", "tool_use_id": None, "content": {"x": 1}, "is_error": "yes"},
    {"type": "tool_use", "id": "t1", "name": "Bash", "input": {"command": "ls"}},
    {"type": "tool_use", "id": 5, "name": None, "input": "not an object"},
    {"type": "thinking", "thinking": 7, "signature": None},
    {"type": "function_call", "call_id": "c1", "name": "shell", "arguments": "{bad json"},
    {"type": "function_call_output", "call_id": "c1", "output": [{"type": "input_text"}]},
    {"type": "reasoning", "summary": "not a list", "content": None},
    {"type": "text"}, {"type": "text", "text": None}, {"text": "no type"}, "a bare string", 3,
]
ODD_SCHEMAS: list[Any] = [
    {"type": "object", "properties": {"a": {"$ref": "#/$defs/missing"}}},
    {"type": "object", "properties": {"a": {"type": ["string", "null", "integer"]}}},
    {"type": "object", "properties": {"a": {"anyOf": []}, "b": {"oneOf": [{}, True]}}},
    {"type": "object", "properties": {"a": {"type": "string", "pattern": "(["}}},
    {"type": "object", "properties": {"a": {"enum": []}, "b": {"const": {"x": [1]}}}},
    {"type": "object", "properties": {"a": {"type": "integer", "minimum": "a", "maximum": -1e308}}},
    {"type": "object", "properties": {"a": {"type": "array", "items": False, "minItems": -3,
                                            "maxItems": 2**64}}},
    {"type": "object", "properties": {"a": {"type": "string", "minLength": 10**12}}},
    {"type": "object", "properties": {"a": {"not": {}}, "b": {"allOf": [{"type": "string"},
                                                                        {"type": "number"}]}}},
    {"type": "object", "required": ["nope", 5], "additionalProperties": {"type": "x"}},
    {"type": "object", "properties": {"a": {"type": "string", "format": "uuid"}},
     "patternProperties": {"^x": {}}, "propertyNames": {"pattern": "^a"}},
    {"type": "object", "properties": {"n": {"$ref": "#/$defs/n"}},
     "$defs": {"n": {"type": "object", "properties": {"n": {"$ref": "#/$defs/n"}}}}},
    {"type": "nonsense"}, {"type": 5}, {"properties": [1, 2]}, True, False, [], "schema", None,
]
TOOL_CHOICES: list[Any] = [
    "auto", "none", "required", "any", "bogus", None, 1, [], {},
    {"type": "auto"}, {"type": "any"}, {"type": "none"}, {"type": "tool"},
    {"type": "tool", "name": "NoSuchTool"}, {"type": "tool", "name": 5},
    {"type": "function", "name": "shell"}, {"type": "function", "function": {"name": None}},
    {"type": "auto", "disable_parallel_tool_use": "yes"}, {"type": "bogus"},
]
GENERATE_KEYS = {"/v1/messages": "max_tokens", "/v1/responses": "max_output_tokens"}


def paths(value: Any, at: Path = ()) -> list[Path]:
    """Every place in the tree, the root first."""
    out = [at]
    if isinstance(value, dict):
        for key, inner in value.items():
            out += paths(inner, (*at, key))
    elif isinstance(value, list):
        for i, inner in enumerate(value):
            out += paths(inner, (*at, i))
    return out


def get(value: Any, at: Path) -> Any:
    for step in at:
        value = value[step]
    return value


def put(root: Any, at: Path, new: Any) -> Any:
    if not at:
        return new
    get(root, at[:-1])[at[-1]] = new
    return root


def nested(depth: int, leaf: Any) -> Any:
    for i in range(depth):
        leaf = [leaf] if i % 2 else {"a": leaf}
    return leaf


def retyped(rng: random.Random, old: Any) -> Any:
    options = [*ODD_VALUES, str(old)[:40], [old], {"value": old},
               nested(rng.choice([3, 40, 300]), old), "x" * rng.choice([1000, 20000])]
    if isinstance(old, (int, float)) and not isinstance(old, bool):
        options += [-old, old * 10**20, str(old)]
    return rng.choice(options)


def edit_value(rng: random.Random, body: Any, at: Path) -> Any:
    return put(body, at, retyped(rng, get(body, at)))


def edit_container(rng: random.Random, body: Any, at: Path) -> Any:
    """Drop, add or copy a key of an object; drop, copy or insert an element of a list."""
    node = get(body, at)
    if isinstance(node, dict) and node:
        key = rng.choice(list(node))
        action = rng.randrange(3)
        if action == 0:
            del node[key]
        elif action == 1:
            node[rng.choice(["type", "role", "content", "text", "id", "name", "zz_unknown"])] = \
                copy.deepcopy(node[key])
        else:
            node[rng.choice(list(node))] = retyped(rng, None)
    elif isinstance(node, list):
        where = rng.randint(0, len(node))
        action = rng.randrange(3)
        if action == 0 and node:
            del node[rng.randrange(len(node))]
        elif action == 1 and node:
            node.insert(where, copy.deepcopy(rng.choice(node)))
        else:
            node.insert(where, copy.deepcopy(rng.choice(ODD_BLOCKS)))
    return body


def edit_block_type(rng: random.Random, body: Any) -> Any:
    blocks = [at for at in paths(body) if isinstance(get(body, at), dict)
              and "type" in get(body, at)]
    if blocks:
        get(body, rng.choice(blocks))["type"] = rng.choice(BLOCK_TYPES)
    return body


def edit_tools(rng: random.Random, body: dict) -> dict:
    tools = body.get("tools")
    if not isinstance(tools, list) or not tools:
        return body
    tool = tools[rng.randrange(len(tools))]
    if not isinstance(tool, dict):
        return body
    key = "input_schema" if "input_schema" in tool else "parameters"
    tool[key] = copy.deepcopy(rng.choice(ODD_SCHEMAS))
    if rng.random() < 0.3:
        tool[rng.choice(["name", "type", "description", "strict"])] = retyped(rng, None)
    return body


def edit_tool_choice(rng: random.Random, body: dict) -> dict:
    body["tool_choice"] = copy.deepcopy(rng.choice(TOOL_CHOICES))
    if rng.random() < 0.3:
        body["parallel_tool_calls"] = retyped(rng, True)
    return body


def cut_down(rng: random.Random, body: dict) -> dict:
    """The last message alone, without the system prompt and (mostly) without tools: a prompt
    that fits a small context, so the edits reach generation."""
    for key in ("system", "instructions", "context_management", "metadata"):
        body.pop(key, None)
    if rng.random() < 0.7:
        body.pop("tools", None)
    elif isinstance(body.get("tools"), list):
        body["tools"] = body["tools"][:1]
    for key in ("messages", "input"):
        if isinstance(body.get(key), list) and body[key]:
            body[key] = body[key][-1:]
    return body


def mutate(rng: random.Random, path: str, body: dict, small: bool = False) -> dict:
    """A variant of ``body`` (which is left as it is); a ``small`` one is always cut down."""
    body = copy.deepcopy(body)
    if small or rng.random() < 0.4:
        body = cut_down(rng, body)
    for _ in range(rng.randint(1, 3)):
        kind = rng.randrange(10)
        if kind < 3 and body:
            body = edit_value(rng, body, rng.choice(paths(body)[1:]))
        elif kind < 6:
            body = edit_container(rng, body, rng.choice(paths(body)))
        elif kind == 6:
            body = edit_block_type(rng, body)
        elif kind == 7:
            body = edit_tools(rng, body)
        elif kind == 8:
            body = edit_tool_choice(rng, body)
        else:
            body["stream"] = rng.choice([True, False, None, "yes", 1])
    if isinstance(body, dict) and rng.random() < 0.9:
        body[GENERATE_KEYS[path]] = rng.choice([1, 2, 4])
    return body
