"""The grammar that makes a model's tool calls well-formed, per format (llguidance Lark).

``tool_choice: "auto"`` arms it lazily at the format's trigger (engine/triggers.py), so the
model writes freely until it starts a call; ``"required"`` and a named function apply it from
the first token (after the reasoning the generation prompt opened, when it did). Each call's
arguments follow its tool's JSON schema with llama.cpp's conventions (``engine.grammar``).
A marker that is one special token of the vocabulary is written as that token (``<[id]>``):
llguidance never matches special tokens by their text.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field

from deployments.api.errors import invalid
from deployments.api.tools.parsers import R1_CALL, R1_CALL_END, R1_CALLS, R1_CALLS_END, R1_SEP
from deployments.api.tools.syntax import (
    DEEPSEEK_R1,
    GPT_OSS,
    HERMES,
    LLAMA3,
    MISTRAL,
    QWEN3_CODER,
    ChatSyntax,
)
from engine.grammar_text import GrammarError, json_lark
from engine.types import TRIGGER_WORD

SpecialToken = Callable[[str], "int | None"]

# Special-token markers of each format: rendered as text in the output (preserved tokens).
MARKERS: dict[str, tuple[str, ...]] = {
    HERMES: ("<tool_call>", "</tool_call>"),
    QWEN3_CODER: ("<tool_call>", "</tool_call>"),
    LLAMA3: ("<|python_tag|>",),
    MISTRAL: ("[TOOL_CALLS]", "[ARGS]", "[CALL_ID]"),
    DEEPSEEK_R1: (R1_CALLS, R1_CALLS_END, R1_CALL, R1_CALL_END, R1_SEP),
    GPT_OSS: ("<|channel|>", "<|constrain|>", "<|message|>", "<|start|>", "<|end|>",
              "<|call|>"),
}
_NOT_PARAM_END = r"/(?s:.*)/ & ~/(?s:.*)\n<\/parameter>(?s:.*)/"


@dataclass
class Constraint:
    """The native request's grammar fields for one chat request."""

    grammar: str = ""
    lazy: bool = False
    triggers: list[dict] = field(default_factory=list)
    preserved: list[str] = field(default_factory=list)


class _Lark:
    """Lark text for one format: literals with the format's special tokens as token ids."""

    def __init__(self, markers: tuple[str, ...], special: SpecialToken):
        ids = {m: special(m) for m in markers}
        self.tokens = {m: i for m, i in ids.items() if i is not None}
        self.split = re.compile("(" + "|".join(map(re.escape, self.tokens)) + ")") \
            if self.tokens else None

    def lit(self, text: str) -> str:
        parts = self.split.split(text) if self.split else [text]
        out = []
        for part in parts:
            if part in self.tokens:
                out.append(f"<[{self.tokens[part]}]>")
            elif part:
                out.append(json.dumps(part, ensure_ascii=False))
        return " ".join(out)


def _schema(tool: dict) -> dict:
    params = tool.get("parameters")
    return params if isinstance(params, dict) and params else {"type": "object"}


def _args(tool: dict) -> str:
    return _json(_schema(tool))


def _json(schema: dict) -> str:
    try:
        return json_lark(schema)
    except GrammarError as exc:
        # the reference's build_grammar throws this for any tool's schema; ex_wrapper: 400
        raise invalid(f"JSON schema conversion failed:\n{exc}") from None


def _json_calls(lark: _Lark, tools: list[dict], head: str, key: str, tail: str, sep: str,
                parallel: bool, suffix: str = "") -> list[str]:
    """Rules of formats whose call is ``head {"name": N, key: ARGS[suffix]} tail``."""
    rules = []
    for i, tool in enumerate(tools):
        name = json.dumps(tool["name"], ensure_ascii=False)
        opening = lark.lit(head + '{"name": ' + name + ', "' + key + '": ')
        rules.append(f"fn{i}: {opening} args{i} {suffix}{lark.lit('}' + tail)}")
        rules.append(f"args{i}: {_args(tool)}")
    rules.insert(0, "call: " + " | ".join(f"fn{i}" for i in range(len(tools))))
    rules.insert(0, f"calls: call ({lark.lit(sep)} call)*" if parallel else "calls: call")
    return rules


def _qwen3_coder(lark: _Lark, tools: list[dict], parallel: bool) -> list[str]:
    """``<tool_call>\n<function=N>\n<parameter=P>\nV\n</parameter>\n...</function>\n
    </tool_call>``, the wrapper optional (the reference's first call may omit it); string
    values are any text up to ``\n</parameter>``, other types JSON."""
    wrapped = f"{lark.lit('<tool_call>' + chr(10))} fn {lark.lit(chr(10) + '</tool_call>')}"
    rules = [f"calls: call ({lark.lit(chr(10))} call)*" if parallel else "calls: call",
             f"call: {wrapped} | fn",
             "fn: " + " | ".join(f"fn{i}" for i in range(len(tools)))]
    for i, tool in enumerate(tools):
        schema = _schema(tool)
        props = schema.get("properties") or {}
        required = [p for p in schema.get("required", []) if p in props]
        params = []
        for j, (pname, pschema) in enumerate(props.items()):
            rules.append(f"v{i}_{j}: {_xml_value(lark, pschema)}")
            value = f"v{i}_{j}"
            item = (f"{lark.lit(f'<parameter={pname}>' + chr(10))} {value} "
                    f"{lark.lit(chr(10) + '</parameter>' + chr(10))}")
            params.append(item if pname in required else f"({item})?")
        rules.append(f"fn{i}: {lark.lit('<function=' + tool['name'] + '>' + chr(10))} "
                     f"{' '.join(params)} {lark.lit('</function>')}")
    return rules + [f"TEXT: {_NOT_PARAM_END}"]


def _xml_value(lark: _Lark, schema: dict) -> str:
    """A parameter's value: a string is its text (one of its enum values when it has them),
    anything else JSON."""
    if not isinstance(schema, dict) or schema.get("type", "string") == "string":
        values = schema.get("enum") if isinstance(schema, dict) else None
        if isinstance(values, list) and all(isinstance(v, str) for v in values):
            return " | ".join(lark.lit(v) for v in values)
        return "TEXT"
    return _json(schema)


def _gpt_oss(lark: _Lark, tools: list[dict]) -> list[str]:
    rules = ["calls: call", "call: " + " | ".join(f"fn{i}" for i in range(len(tools)))]
    for i, tool in enumerate(tools):
        head = f"<|channel|>commentary to=functions.{tool['name']} <|constrain|>json<|message|>"
        rules += [f"fn{i}: {lark.lit(head)} args{i}", f"args{i}: {_args(tool)}"]
    return rules


def _call_rules(fmt: str, lark: _Lark, tools: list[dict], parallel: bool) -> list[str]:
    if fmt == HERMES:
        return _json_calls(lark, tools, "<tool_call>\n", "arguments", "\n</tool_call>", "\n",
                           parallel)
    if fmt == LLAMA3:
        return _json_calls(lark, tools, "", "parameters", "", "; ", parallel)
    if fmt == MISTRAL:
        id_key = lark.lit(', "id": "')
        rules = _json_calls(lark, tools, "", "arguments", "", ", ", parallel,
                            suffix=f"{id_key} CALL_ID {lark.lit(chr(34))} ")
        rules[0] = f"calls: {lark.lit('[TOOL_CALLS][')} {rules[0][7:]} {lark.lit(']')}"
        return rules + ["CALL_ID: /[a-zA-Z0-9]{9}/"]
    if fmt == DEEPSEEK_R1:
        head = f"{R1_CALL}function{R1_SEP}"
        rules = []
        for i, tool in enumerate(tools):
            rules += [f"fn{i}: {lark.lit(head + tool['name'] + chr(10) + '```json' + chr(10))} "
                      f"args{i} {lark.lit(chr(10) + '```' + R1_CALL_END)}",
                      f"args{i}: {_args(tool)}"]
        calls = "call (\"\\n\" call)*" if parallel else "call"
        return [f"calls: {lark.lit(R1_CALLS)} {calls} {lark.lit(R1_CALLS_END)}",
                "call: " + " | ".join(f"fn{i}" for i in range(len(tools)))] + rules
    if fmt == QWEN3_CODER:
        return _qwen3_coder(lark, tools, parallel)
    return _gpt_oss(lark, tools)


def triggers(fmt: str, tools: list[dict]) -> list[str]:
    """The words that arm the lazy grammar (none for Llama 3.x: its calls have no marker)."""
    if fmt == HERMES:
        return ["<tool_call>\n"]
    if fmt == QWEN3_CODER:
        return ["<tool_call>"] + [f"<function={t['name']}>" for t in tools]
    if fmt == MISTRAL:
        return ["[TOOL_CALLS]"]
    if fmt == DEEPSEEK_R1:
        return [R1_CALLS]
    if fmt == GPT_OSS:
        return ["<|channel|>commentary to="]
    return []


def tool_constraint(syntax: ChatSyntax, tools: list[dict], lazy: bool, parallel: bool,
                    special: SpecialToken) -> Constraint:
    """The grammar over ``tools`` (all of them, or the named one) for ``syntax``'s format."""
    fmt = syntax.format
    markers = MARKERS.get(fmt, ()) + ((syntax.think_start, syntax.think_end)
                                      if syntax.thinks else ())
    words = triggers(fmt, tools)
    if not tools or fmt not in MARKERS or (lazy and not words):
        return Constraint(preserved=list(markers))
    lark = _Lark(markers, special)
    rules = _call_rules(fmt, lark, tools, parallel)
    first = "" if lazy else _reasoning_first(syntax, lark)
    if first:
        rules.append(THOUGHT_RULE)
    grammar = "%llguidance {}\nstart: " + first + "calls\n" + "\n".join(rules) + "\n"
    return Constraint(grammar, lazy, [{"type": TRIGGER_WORD, "value": w} for w in words],
                      list(markers))


def _reasoning_first(syntax: ChatSyntax, lark: _Lark) -> str:
    """Reasoning the generation prompt opened comes first, up to its end tag."""
    if syntax.format == GPT_OSS:
        lark_end = lark.lit("<|end|><|start|>assistant")
        return f"({lark.lit('<|channel|>analysis<|message|>')} THOUGHT {lark_end})? "
    if not (syntax.reasoning and syntax.in_reasoning):
        return ""
    return f"THOUGHT {lark.lit(syntax.think_end)} /[ \\t\\n]{{0,2}}/ "


THOUGHT_RULE = "THOUGHT: /(?s:.*)/ & ~/(?s:.*)(<\\/think>|<\\|end\\|>)(?s:.*)/"
