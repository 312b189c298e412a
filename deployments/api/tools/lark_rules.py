"""Building blocks of the tool-call grammars (llguidance Lark): literals with a format's
special tokens as token ids, each call's JSON arguments from its tool's schema, and the two
shapes most formats share: JSON arguments between literals, and tagged parameters."""

from __future__ import annotations

import json
import re
from collections.abc import Callable

from deployments.api.errors import invalid
from engine.grammar_text import GrammarError, json_lark

SpecialToken = Callable[[str], "int | None"]


class Lark:
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


def tool_schema(tool: dict) -> dict:
    params = tool.get("parameters")
    return params if isinstance(params, dict) and params else {"type": "object"}


def tool_args(tool: dict) -> str:
    return json_rule(tool_schema(tool))


def json_rule(schema: dict) -> str:
    try:
        return json_lark(schema)
    except GrammarError as exc:
        # the reference's build_grammar throws this for any tool's schema; ex_wrapper: 400
        raise invalid(f"JSON schema conversion failed:\n{exc}") from None


def xml_value(lark: Lark, schema: dict) -> str:
    """A parameter's value: a string is its text (one of its enum values when it has them),
    anything else JSON."""
    if not isinstance(schema, dict) or schema.get("type", "string") == "string":
        values = schema.get("enum") if isinstance(schema, dict) else None
        if isinstance(values, list) and all(isinstance(v, str) for v in values):
            return " | ".join(lark.lit(v) for v in values)
        return "TEXT"
    return json_rule(schema)


def calls_rules(lark: Lark, tools: list[dict], parallel: bool, fn: Callable[[int, dict], str],
           opening: str = "", closing: str = "", sep: str = "") -> list[str]:
    """``opening call (sep call)* closing``, a call being one of the tools' ``fn`` rules."""
    many = f"call ({lark.lit(sep)} call)*" if sep else "call+"
    head = lark.lit(opening) + " " if opening else ""
    tail = " " + lark.lit(closing) if closing else ""
    rules = [f"calls: {head}{many if parallel else 'call'}{tail}",
             "call: " + " | ".join(f"fn{i}" for i in range(len(tools)))]
    for i, tool in enumerate(tools):
        rules += [f"fn{i}: {fn(i, tool)}", f"args{i}: {tool_args(tool)}"]
    return rules


Param = Callable[[str, bool], tuple[str, str]]  # (name, is a string) -> its opening, closing


def tagged_rules(lark: Lark, tools: list[dict], opening: Callable[[str], str], param: Param,
                 closing: str, terminal: str) -> list[str]:
    """Calls whose arguments are tagged parameters: ``opening(N) (param_open V param_close)*
    closing``, required parameters first as the templates render them; a string is any text
    up to its closing tag (the terminal ends with the tag, llguidance's lexer being greedy,
    unless the tag is a special token), other types JSON."""
    rules: list[str] = []
    texts: dict[str, str] = {}  # each closing tag's text terminal
    for i, tool in enumerate(tools):
        schema = tool_schema(tool)
        props = schema.get("properties") or {}
        required = [p for p in schema.get("required", []) if p in props]
        items = []
        for j, (pname, pschema) in enumerate(props.items()):
            value = xml_value(lark, pschema)
            before, after = param(pname, value == "TEXT" or not is_typed(pschema))
            end = after.rstrip()
            if value == "TEXT":
                value = texts.setdefault(end, f"{terminal}{len(texts) or ''}")
                if end not in lark.tokens:
                    after = after[len(end):]
            rules.append(f"v{i}_{j}: {value}")
            item = f"{lark.lit(before)} v{i}_{j} {lark.lit(after)}".rstrip()
            items.append(item if pname in required else f"({item})?")
        rules.append(f"fn{i}: {lark.lit(opening(tool['name']))} {' '.join(items)} "
                     f"{lark.lit(closing)}")
    return rules + [_text_terminal(name, end, end not in lark.tokens)
                    for end, name in texts.items()]


def is_typed(schema: dict) -> bool:
    return isinstance(schema, dict) and schema.get("type", "string") != "string"


def _text_terminal(name: str, end: str, in_text: bool) -> str:
    pattern = regex_text(end)
    if in_text:  # up to the first closing tag, the tag included
        return f"{name}: /(?s:.*){pattern}/ & ~/(?s:.*){pattern}(?s:.+)/"
    return f"{name}: /(?s:.*)/ & ~/(?s:.*){pattern}(?s:.*)/"


def tagged_calls(opening: str, closing: str, sep: str, fn_open: Callable[[str], str],
                  param: Param, fn_close: str, terminal: str):
    def rules(lark: Lark, tools: list[dict], parallel: bool) -> list[str]:
        many = f"call ({lark.lit(sep)} call)*" if parallel else "call"
        head = lark.lit(opening) + " " if opening else ""
        tail = " " + lark.lit(closing) if closing else ""
        return ([f"calls: {head}{many}{tail}",
                 "call: " + " | ".join(f"fn{i}" for i in range(len(tools)))]
                + tagged_rules(lark, tools, fn_open, param, fn_close, terminal))
    return rules


def json_in(opening: str, closing: str, sep: str, head: Callable[[dict], str], tail: str):
    """Calls ``opening head(tool) ARGS tail (sep ...)* closing``."""
    def rules(lark: Lark, tools: list[dict], parallel: bool) -> list[str]:
        return calls_rules(lark, tools, parallel,
                      lambda i, t: f"{lark.lit(head(t))} args{i} {lark.lit(tail)}".rstrip(),
                      opening, closing, sep)
    return rules


def quoted(tool: dict) -> str:
    return json.dumps(tool["name"], ensure_ascii=False)


def regex_text(text: str) -> str:
    """``text`` as a literal inside a Lark ``/.../`` regex."""
    return "".join("\\n" if c == "\n" else "\\/" if c == "/" else re.escape(c) for c in text)
