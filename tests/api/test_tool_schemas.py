"""Tool schemas and ``json_schema`` as llama.cpp takes them (common/json-schema-to-grammar.cpp):
a keyword the grammar cannot enforce is left out with a warning in the log, never a 400; what
the reference refuses (an unresolvable ``$ref``, an invalid pattern, an unrecognized schema)
is refused with the reference's text. Fed with the tool lists Claude Code and Codex CLI send
(tests/fixtures/agents, recorded from the agents: tests/serve/test_agents.py)."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import llguidance
import pytest

from deployments.api.errors import ApiError
from deployments.api.protocols.anthropic import to_chat
from deployments.api.protocols.responses import _tools as responses_tools
from deployments.api.tools.grammars import MARKERS, tool_constraint
from deployments.api.tools.request import parse_tools
from deployments.api.tools.syntax import ChatSyntax
from engine.grammar_text import GrammarError, json_lark, json_schema_grammar
from engine.schema_refusals import pattern_problem, refusals

AGENTS = Path(__file__).resolve().parents[1] / "fixtures" / "agents"


def agent_tools(name: str) -> list[dict]:
    """The declared tools of a recorded agent request, as the chat route reads them."""
    recorded = json.loads((AGENTS / name).read_text())
    body = recorded["body"]
    chat_tools = to_chat(body)["tools"] if recorded["path"] == "/v1/messages" \
        else responses_tools(body["tools"])
    return parse_tools(chat_tools)


def compiles(grammar: str) -> None:
    failed, messages = llguidance.LLMatcher.validate_grammar_with_warnings(
        llguidance.LLMatcher.grammar_from_lark(grammar))
    assert not failed, messages


@pytest.mark.parametrize("agent", ["claude-code.json", "claude-code-tool-search.json",
                                   "codex.json"])
@pytest.mark.parametrize("fmt", sorted(MARKERS))
def test_agents_tool_lists_build_in_every_format(agent, fmt):
    tools = agent_tools(agent)
    assert len(tools) >= 7
    for lazy in (True, False):
        constraint = tool_constraint(ChatSyntax(format=fmt), tools, lazy, True, lambda _: None)
        if constraint.grammar:
            compiles(constraint.grammar)


UNENFORCED = {
    "propertyNames": {"type": "object", "propertyNames": {"pattern": "^[a-z]+$"},
                      "additionalProperties": {"type": "string"}},
    "if/then/else": {"type": "object", "properties": {"a": {"type": "string"}},
                     "if": {"required": ["a"]}, "then": {"required": ["a"]}, "else": {}},
    "unevaluatedProperties": {"type": "object", "properties": {"a": {"type": "integer"}},
                              "unevaluatedProperties": False},
    "dependentRequired": {"type": "object", "properties": {"a": {}, "b": {}},
                          "dependentRequired": {"a": ["b"]}},
    "lookahead pattern": {"type": "object", "properties": {
        "p": {"type": "string", "pattern": "^(?=.*[0-9]).{8,}$"}}},
}


@pytest.mark.parametrize("name", sorted(UNENFORCED))
def test_an_unenforced_keyword_is_a_warning(name, caplog):
    schema = UNENFORCED[name]
    with caplog.at_level(logging.WARNING, logger="mlxray.grammar"):
        compiles(json_schema_grammar(schema))
    assert "JSON schema conversion was incomplete" in caplog.text
    tool = {"name": "t", "description": "", "parameters": schema}
    compiles(tool_constraint(ChatSyntax(format="hermes"), [tool], False, False,
                             lambda _: None).grammar)


def test_what_is_enforced_still_is():
    """Lenient is about keywords llguidance lacks, not the ones it has: a pattern it can
    compile stays (the reference's converter would drop ``\\d``, llguidance keeps it)."""
    grammar = json_lark({"type": "string", "pattern": "^\\d+$"})
    assert '"pattern":"^\\\\d+$"' in grammar
    assert "lenient" in grammar
    compiles(json_schema_grammar({"type": "object", "patternProperties": {
        "^x-": {"type": "string"}}}))  # llguidance enforces it


REFUSED = [
    ({"type": "object", "properties": {"a": {"$ref": "#/$defs/x"}}},
     'Error resolving ref #/$defs/x: $defs not in {"type":"object","properties":{"a":'
     '{"$ref":"#/$defs/x"}}}'),
    ({"$ref": "other.json#/a"}, "Unsupported ref: other.json#/a"),
    ({"$defs": {"l": [1]}, "items": {"$ref": "#/$defs/l/3"}},
     "Error resolving ref #/$defs/l/3: 3 not in [1]"),
    ({"type": "string", "pattern": "^(ab$"}, "Invalid pattern ^(ab$: unbalanced parentheses"),
    ({"type": "string", "pattern": "^ab)$"}, "Invalid pattern ^ab)$: unbalanced parentheses"),
    ({"type": "string", "pattern": "^[ab$"},
     "Invalid pattern ^[ab$: unterminated character class"),
    ({"type": "string", "pattern": "^+a$"}, "Invalid pattern ^+a$: nothing to repeat"),
    ({"type": "string", "pattern": "^a\\$"}, "Invalid pattern ^a\\$: trailing backslash"),
    ({"type": "nonsense-type"}, 'Unrecognized schema: {"type":"nonsense-type"}'),
    ({"properties": {"a": True}}, "Unrecognized schema: true"),
]


@pytest.mark.parametrize("schema,message", REFUSED)
def test_what_the_reference_refuses_is_refused_with_its_text(schema, message):
    assert refusals(schema) == [message]
    with pytest.raises(GrammarError) as exc:
        json_lark(schema)
    assert str(exc.value) == message
    tool = {"name": "t", "description": "", "parameters": schema}
    with pytest.raises(ApiError) as api:
        tool_constraint(ChatSyntax(format="hermes"), [tool], False, False, lambda _: None)
    assert api.value.code == 400
    assert api.value.message == "JSON schema conversion failed:\n" + message


def test_errors_are_collected_in_the_reference_order():
    schema = {"properties": {"a": {"$ref": "#/nowhere"}, "b": {"type": "string",
                                                               "pattern": "^[x$"}}}
    assert refusals(schema) == [
        "Error resolving ref #/nowhere: nowhere not in "
        + json.dumps(schema, separators=(",", ":")),
        "Invalid pattern ^[x$: unterminated character class"]


def test_unvisited_subschemas_are_not_checked():
    """As the reference: an unreferenced ``$defs`` entry and ``not`` are never visited."""
    assert refusals({"$defs": {"bad": {"type": "nope"}}, "type": "object"}) == []
    assert refusals({"type": "object", "properties": {"a": {"$ref": "#/$defs/ok"}},
                     "$defs": {"ok": {"type": "string"}, "bad": {"pattern": "^(x$"}}}) == []


@pytest.mark.parametrize("pattern,problem", [
    ("^abc$", None), ("^[a-z]{2,3}(-[0-9]+)?$", None), ("^a|b$", None),
    ("abc", (False, "not anchored with '^' and '$'")),
    ("^(?=a)$", (False, "unsupported group syntax")),
    ("^\\d$", (False, "unsupported escape: \\d")),
    ("^a{x}$", (False, "invalid number in curly brackets")),
    ("^a{1,2,3}$", (False, "wrong number of values in curly brackets")),
    ("^{2}$", (True, "nothing to repeat")),
])
def test_pattern_scanner_follows_the_reference(pattern, problem):
    assert pattern_problem(pattern) == problem
