"""Request bodies of the OpenAPI document (FastAPI's /openapi.json).

The routes read raw bodies, so that parsing, coercions and error messages are llama-server's
(deployments/api/schema.py), and FastAPI cannot infer them. These declarations describe the bodies
for clients and schema fuzzers; they validate nothing.
"""

from __future__ import annotations

from typing import Any

from deployments.api.schema import FIELDS

_JSON_TYPES = {"int32": "integer", "int64": "integer", "uint32": "integer", "float": "number",
               "bool": "boolean", "str": "string"}
_TOKEN_OR_TEXT = {"oneOf": [{"type": "string"}, {"type": "integer"}]}


def _completion_schema() -> dict[str, Any]:
    properties: dict[str, Any] = {"prompt": {
        "description": "text, token ids, text and ids mixed, or an array of such prompts",
        "oneOf": [{"type": "string"}, {"type": "array", "items": {}}, {"type": "object"}],
    }}
    nested: dict[str, dict[str, Any]] = {}
    for field in FIELDS:
        schema = {"type": _JSON_TYPES[field.kind]} if field.kind in _JSON_TYPES else {}
        target = nested.setdefault(field.parent, {}) if field.parent else properties
        for key in field.keys:
            target[key] = schema
    for parent, children in nested.items():
        properties[parent] = {"type": "object", "properties": children}
    return {"type": "object", "required": ["prompt"], "properties": properties}


COMPLETION = _completion_schema()
OAI_COMPLETION = {**COMPLETION, "properties": {
    "model": {"type": "string"}, **COMPLETION["properties"]}}
_MESSAGE = {"type": "object", "required": ["role"], "properties": {
    "role": {"type": "string"},
    "content": {"oneOf": [{"type": "string"}, {"type": "array", "items": {"type": "object"}},
                          {"type": "null"}]},
}}
CHAT = {"type": "object", "required": ["messages"], "properties": {
    "model": {"type": "string"},
    "messages": {"type": "array", "items": _MESSAGE},
    **{k: v for k, v in COMPLETION["properties"].items() if k != "prompt"},
}}
TOKENIZE = {"type": "object", "properties": {
    "content": {"oneOf": [{"type": "string"}, {"type": "array", "items": _TOKEN_OR_TEXT}]},
    "add_special": {"type": "boolean"},
    "parse_special": {"type": "boolean"},
    "with_pieces": {"type": "boolean"},
}}
DETOKENIZE = {"type": "object", "properties": {
    "tokens": {"type": "array", "items": {"type": "integer"}},
}}


def body(schema: dict[str, Any]) -> dict[str, Any]:
    """``openapi_extra`` of a route whose JSON body is ``schema``."""
    return {"requestBody": {"required": True,
                            "content": {"application/json": {"schema": schema}}}}
