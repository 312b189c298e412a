"""Grammar strings without MLX: llama.cpp's rule for GBNF against Lark, and a JSON schema as a
grammar string. The ingress validates a request's json_schema here (no model, no MLX); the
engine compiles the strings (engine/grammar.py)."""

from __future__ import annotations

import json
import logging
from typing import Any

import llguidance
from llguidance.gbnf_to_lark import gbnf_to_lark

from engine.schema_refusals import dump, refusals

log = logging.getLogger("mlxray.grammar")
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
    """``%json <schema>``, a Lark rule body (llama.cpp's conventions applied to the schema).

    Raises GrammarError with the reference's reasons where llama.cpp refuses the schema
    (engine/schema_refusals.py). A keyword llguidance does not enforce (``propertyNames``,
    ``if``/``then``/``else``, ...) or a pattern it cannot compile is left out of the grammar
    with a warning in the log, as the reference leaves out what it cannot convert."""
    if not isinstance(schema, dict):
        raise GrammarError(f"Unrecognized schema: {dump(schema)}")
    errors = refusals(schema)
    if errors:
        raise GrammarError("\n".join(errors))
    normalized = _close_objects(_wide_integers_as_floats(schema))
    guidance = normalized.get("x-guidance")
    normalized["x-guidance"] = {**JSON_OPTIONS, **(guidance if isinstance(guidance, dict) else {})}
    failed, messages = _check(normalized)
    if failed:
        dropped = [f"pattern {p} is not supported, accepting any string"
                   for p in _drop_patterns(normalized)]
        if dropped:
            failed, messages = _check(normalized)
            messages = messages if failed else dropped + messages
    if failed:
        raise GrammarError("\n".join(messages))
    if messages:
        log.warning("JSON schema conversion was incomplete: %s", "; ".join(messages))
    return "%json " + json.dumps(normalized, ensure_ascii=False, separators=(",", ":"))


def _check(schema: dict) -> tuple[bool, list[str]]:
    """llguidance's verdict, lenient: unimplemented keywords are warnings, not errors."""
    schema["x-guidance"] = {**schema["x-guidance"], "lenient": True}
    try:
        grammar = llguidance.LLMatcher.grammar_from_json_schema(schema)
    except ValueError as exc:  # an integer past 64 bits: "Value is not JSON serializable: ..."
        return True, [str(exc)]
    return llguidance.LLMatcher.validate_grammar_with_warnings(grammar)


def _drop_patterns(node: Any) -> list[str]:
    """Removes, in place, every ``pattern`` llguidance cannot compile; returns them."""
    dropped: list[str] = []
    if isinstance(node, list):
        for item in node:
            dropped += _drop_patterns(item)
    elif isinstance(node, dict):
        pattern = node.get("pattern")
        if isinstance(pattern, str) and _check({"type": "string", "pattern": pattern,
                                                "x-guidance": {}})[0]:
            del node["pattern"]
            dropped.append(pattern)
        for value in node.values():
            dropped += _drop_patterns(value)
    return dropped


def _wide_integers_as_floats(node: Any) -> Any:
    """A copy where an integer past 64 bits is a float, as nlohmann::json parses it (llguidance
    takes no wider integer)."""
    if isinstance(node, list):
        return [_wide_integers_as_floats(v) for v in node]
    if isinstance(node, dict):
        return {k: _wide_integers_as_floats(v) for k, v in node.items()}
    if isinstance(node, int) and not isinstance(node, bool) and not -2**63 <= node < 2**64:
        return float(node)
    return node


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
