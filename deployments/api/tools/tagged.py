"""Tool-call formats whose arguments are not one JSON object (spec §2): each parameter in its
own tags (GLM, MiniMax, Seed-OSS, MiniCPM5, Hunyuan, DeepSeek's DSML), Gemma 4's own object
syntax, LFM2's Python calls. The arguments become compact JSON: a string-typed parameter's
text as a JSON string, any other type's text as JSON."""

from __future__ import annotations

import ast
import json
from collections.abc import Callable

from deployments.api.tools.families import end_of, escaped, is_string, tool_name
from deployments.api.tools.scan import Cursor, Incomplete, Mismatch, held_back
from deployments.api.tools.syntax import (
    DSML,
    GEMMA4,
    GLM,
    HUNYUAN,
    LFM2,
    MINICPM5,
    MINIMAX_M2,
    MINIMAX_M3,
    SEED_OSS,
    ChatSyntax,
    ToolCall,
)

Calls = list[ToolCall]
MM = "]<]minimax[>["  # MiniMax-M3's tag prefix
DSML_BAR = "｜DSML｜"


class _Arguments:
    """A call's arguments built parameter by parameter into compact JSON."""

    def __init__(self, syntax: ChatSyntax, calls: Calls, name: str):
        self.syntax, self.name = syntax, name
        self.call = ToolCall(name, "{")
        calls.append(self.call)
        self.done = "{"

    def head(self, param: str, string: bool) -> str:
        head = ("" if self.done == "{" else ",") + json.dumps(param, ensure_ascii=False) + ":"
        return head + ('"' if string else "")

    def read(self, cur: Cursor, param: str, value_end: str, string: bool | None = None) -> None:
        """The value up to ``value_end`` (consumed); a string is kept as it is written."""
        string = is_string(self.syntax, self.name, param) if string is None else string
        head = self.head(param, string)
        self.call.arguments = self.done + head
        try:
            value = cur.until(value_end)
        except Incomplete:
            so_far = held_back(cur.rest, value_end)
            self.call.arguments += escaped(so_far) if string else so_far
            raise
        if not string:
            try:
                json.loads(value)
            except ValueError:
                raise Mismatch from None
        self.done += head + (escaped(value) + '"' if string else value.strip())
        self.call.arguments = self.done

    def close(self) -> None:
        self.call.arguments = self.done + "}"


def tagged_arguments(cur: Cursor, syntax: ChatSyntax, calls: Calls, name: str,
                     tags: tuple[str, str, str, str], end: str) -> None:
    """``open KEY key_end [ws value_open] VALUE value_end`` per parameter, then ``end``."""
    opening, key_end, value_open, value_end = tags
    args = _Arguments(syntax, calls, name)
    while cur.peek(opening):
        cur.expect(opening)
        param = cur.until(key_end)
        if value_open:
            cur.ws()
            cur.expect(value_open)
        args.read(cur, param, value_end)
        cur.ws()
    cur.expect(end)
    args.close()


def tagged_calls(opening: str, closing: str, call_open: str, name_end: str,
                 tags: tuple[str, str, str, str], call_end: str) -> Callable:
    """``opening (call_open NAME name_end PARAMS call_end)+ closing``; without ``opening``,
    calls follow one another to the end of the text."""
    def read(cur: Cursor, syntax: ChatSyntax, calls: Calls) -> None:
        if opening:
            cur.expect(opening)
        while True:
            cur.ws()
            if closing and cur.peek(closing):
                end_of(cur, closing)
                return
            cur.expect(call_open)
            name = tool_name(cur, syntax)
            cur.expect(name_end)
            cur.ws()
            tagged_arguments(cur, syntax, calls, name, tags, call_end)
            cur.ws()
            if not closing and cur.at_end():
                return
    return read


def _dsml(cur: Cursor, syntax: ChatSyntax, calls: Calls) -> None:
    """``<｜DSML｜function_calls>`` (V3.2; ``tool_calls`` in V4) of ``<｜DSML｜invoke name="N">``
    with ``<｜DSML｜parameter name="K" string="true|false">V</｜DSML｜parameter>``."""
    cur.expect(f"<{DSML_BAR}")
    section = "tool_calls" if cur.peek("tool_calls>") else "function_calls"
    cur.expect(section + ">")
    while True:
        cur.ws()
        if cur.peek(f"</{DSML_BAR}{section}>"):
            end_of(cur, f"</{DSML_BAR}{section}>")
            return
        cur.expect(f'<{DSML_BAR}invoke name="')
        name = tool_name(cur, syntax)
        cur.expect('">')
        args = _Arguments(syntax, calls, name)
        while True:
            cur.ws()
            if not cur.peek(f'<{DSML_BAR}parameter name="'):
                break
            cur.expect(f'<{DSML_BAR}parameter name="')
            param = cur.until('"')
            cur.ws()
            string = True
            if cur.peek("string="):
                string = cur.until(">").strip() == 'string="true"'
            else:
                cur.expect(">")
            args.read(cur, param, f"</{DSML_BAR}parameter>", string)
        cur.expect(f"</{DSML_BAR}invoke>")
        args.close()


def _minimax_m3(cur: Cursor, syntax: ChatSyntax, calls: Calls) -> None:
    """``]<]minimax[>[<tool_call>`` of ``<invoke name="N">`` with ``<K>V</K>``, every tag
    after MiniMax-M3's ``]<]minimax[>[`` prefix."""
    cur.expect(MM + "<tool_call>")
    while True:
        cur.ws()
        if cur.peek(MM + "</tool_call>"):
            end_of(cur, MM + "</tool_call>")
            return
        cur.expect(MM + '<invoke name="')
        name = tool_name(cur, syntax)
        cur.expect('">')
        args = _Arguments(syntax, calls, name)
        while not cur.peek(MM + "</invoke>"):
            cur.expect(MM + "<")
            param = cur.until(">")
            args.read(cur, param, f"{MM}</{param}>")
        cur.expect(MM + "</invoke>")
        args.close()


def _gemma4(cur: Cursor, syntax: ChatSyntax, calls: Calls) -> None:
    """``<|tool_call>call:NAME{key:<|"|>text<|"|>,n:3}<tool_call|>`` per call."""
    while True:
        cur.expect("<|tool_call>call:")
        call = ToolCall(tool_name(cur, syntax), "{")
        calls.append(call)
        value = _gemma_value(cur)
        if not isinstance(value, dict):
            raise Mismatch
        call.arguments = json.dumps(value, ensure_ascii=False, separators=(",", ":"))
        cur.expect("<tool_call|>")
        cur.ws()
        if cur.at_end():
            return


GEMMA_QUOTE = '<|"|>'


def _gemma_value(cur: Cursor) -> object:
    if cur.peek(GEMMA_QUOTE):
        cur.expect(GEMMA_QUOTE)
        return cur.until(GEMMA_QUOTE)
    if cur.peek("{") or cur.peek("["):
        closing = "}" if cur.peek("{") else "]"
        cur.pos += 1
        out: dict | list = {} if closing == "}" else []
        while not cur.peek(closing):
            if out:
                cur.expect(",")
            if isinstance(out, dict):
                key = cur.until(":").strip()
                out[key] = _gemma_value(cur)
            else:
                out.append(_gemma_value(cur))
        cur.expect(closing)
        return out
    start = cur.pos
    while not cur.at_end() and cur.text[cur.pos] not in ",}]":
        cur.pos += 1
    if cur.at_end():
        raise Incomplete
    text = cur.text[start:cur.pos].strip()
    try:
        return json.loads(text)
    except ValueError:
        return text


def _lfm2(cur: Cursor, syntax: ChatSyntax, calls: Calls) -> None:
    """``<|tool_call_start|>[name(key='v', n=3), ...]<|tool_call_end|>`` (Python calls)."""
    cur.expect("<|tool_call_start|>")
    body = cur.until("<|tool_call_end|>")
    try:
        tree = ast.parse(body.strip(), mode="eval").body
    except SyntaxError:
        raise Mismatch from None
    items = tree.elts if isinstance(tree, ast.List) else [tree]
    for item in items:
        if not (isinstance(item, ast.Call) and isinstance(item.func, ast.Name)) \
                or syntax.tool(item.func.id) is None or item.args:
            raise Mismatch
        try:
            arguments = {k.arg: ast.literal_eval(k.value) for k in item.keywords}
        except ValueError:
            raise Mismatch from None
        calls.append(ToolCall(item.func.id, json.dumps(arguments, ensure_ascii=False,
                                                       separators=(",", ":"))))
    cur.ws()
    if not cur.at_end():
        raise Mismatch


TAGGED: dict[str, tuple[tuple[str, ...], Callable]] = {
    GLM: (("<tool_call>",), tagged_calls(
        "", "", "<tool_call>", "",
        ("<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>"), "</tool_call>")),
    MINIMAX_M2: (("<minimax:tool_call>",), tagged_calls(
        "<minimax:tool_call>", "</minimax:tool_call>", '<invoke name="', '">',
        ('<parameter name="', '">', "", "</parameter>"), "</invoke>")),
    SEED_OSS: (("<seed:tool_call>",), tagged_calls(
        "", "", "<seed:tool_call>\n<function=", ">",
        ("<parameter=", ">", "", "</parameter>"), "</function>\n</seed:tool_call>")),
    MINICPM5: (('<function name="',), tagged_calls(
        "", "", '<function name="', '">', ('<param name="', '">', "", "</param>"),
        "</function>")),
    HUNYUAN: (("<tool_calls:opensource>",), tagged_calls(
        "<tool_calls:opensource>", "</tool_calls:opensource>", "<tool_call:opensource>",
        "<tool_sep:opensource>",
        ("<arg_key:opensource>", "</arg_key:opensource>", "<arg_value:opensource>",
         "</arg_value:opensource>"), "</tool_call:opensource>")),
    DSML: ((f"<{DSML_BAR}function_calls>", f"<{DSML_BAR}tool_calls>"), _dsml),
    MINIMAX_M3: ((MM + "<tool_call>",), _minimax_m3),
    GEMMA4: (("<|tool_call>",), _gemma4),
    LFM2: (("<|tool_call_start|>",), _lfm2),
}
