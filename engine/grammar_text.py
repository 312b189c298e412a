"""Grammar strings without MLX: llama.cpp's rule for GBNF against Lark, and a JSON schema as a
grammar string. The ingress validates a request's json_schema here (no model, no MLX); the
engine compiles the strings (engine/grammar.py)."""

from __future__ import annotations

import json
from typing import Any

import llguidance
from llguidance.gbnf_to_lark import gbnf_to_lark

LARK_PREFIX = "%llguidance"
# llama.cpp's json_schema_to_grammar separates items and keys with ", " and ": " and gives an
# object no properties beyond the listed ones unless additionalProperties says so.
JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


class GrammarError(ValueError):
    """A grammar that does not parse or compile; the message is llguidance's."""


def to_lark(grammar: str) -> str:
    """llama.cpp's rule: ``%llguidance`` selects Lark, anything else is GBNF."""
    if grammar.lstrip().startswith(LARK_PREFIX):
        return grammar
    try:
        return gbnf_to_lark(grammar)
    except Exception as exc:  # noqa: BLE001 - the converter raises bare Exception too
        raise GrammarError(str(exc)) from None


def json_schema_grammar(schema: Any) -> str:
    """A JSON schema as a grammar string (Lark with an inline ``%json``); raises GrammarError
    when llguidance cannot compile the schema."""
    return f"{LARK_PREFIX} {{}}\nstart: {json_lark(schema)}\n"


def json_lark(schema: Any) -> str:
    """``%json <schema>``, a Lark rule body (llama.cpp's conventions applied to the schema);
    raises GrammarError when llguidance cannot compile the schema."""
    if not isinstance(schema, dict):
        raise GrammarError(f"Unrecognized schema: {json.dumps(schema)}")
    normalized = _close_objects(schema)
    guidance = normalized.get("x-guidance")
    normalized["x-guidance"] = {**JSON_OPTIONS, **(guidance if isinstance(guidance, dict) else {})}
    error = llguidance.LLMatcher.validate_grammar(
        llguidance.LLMatcher.grammar_from_json_schema(normalized))
    if error:
        raise GrammarError(error)
    return "%json " + json.dumps(normalized, ensure_ascii=False, separators=(",", ":"))


def _close_objects(node: Any) -> Any:
    """A copy where every object schema with ``properties`` and no ``additionalProperties``
    allows no other keys (llama.cpp's default, unlike JSON Schema's)."""
    if isinstance(node, list):
        return [_close_objects(v) for v in node]
    if not isinstance(node, dict):
        return node
    out = {}
    for key, value in node.items():
        if key in ("properties", "$defs", "definitions", "patternProperties") and isinstance(
                value, dict):
            out[key] = {k: _close_objects(v) for k, v in value.items()}
        elif key in ("items", "additionalProperties", "not", "anyOf", "oneOf", "allOf",
                     "prefixItems", "if", "then", "else", "contains"):
            out[key] = _close_objects(value)
        else:
            out[key] = value
    if isinstance(out.get("properties"), dict) and "additionalProperties" not in out:
        out["additionalProperties"] = False
    return out
