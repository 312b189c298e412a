"""The other tool-call formats of llama-server's ``common/chat.cpp`` (spec §2), one reader each
over the generated text, in the same terms as ``parsers.py`` (a ``Cursor`` that reports text
that ended too early as ``Incomplete``); ``FAMILIES`` maps each format to its trigger words and
reader, and ``parsers.FORMATS`` takes them in.

Tool names are read as literals of the declared tools, as the reference's parser does. JSON
arguments keep the model's text; tagged arguments become compact JSON, a string-typed
parameter's text as a JSON string, any other type's text as JSON.
"""

from __future__ import annotations

import json
from collections.abc import Callable

from deployments.api.tools.scan import Cursor, Incomplete, Mismatch, held_back, json_object
from deployments.api.tools.syntax import (
    APERTUS,
    APRIEL,
    COMMAND_R7B,
    DEEPSEEK_V3_1,
    FUNCTIONARY_V3_1,
    GIGACHAT3,
    GIGACHAT3_1,
    KIMI_K2,
    MINIMAX_M1,
    MISTRAL_ARGS,
    NEMOTRON_V2,
    SOLAR,
    ChatMessage,
    ChatSyntax,
    ParseFailure,
    ToolCall,
)

Calls = list[ToolCall]
GIGACHAT3_CALL = "<|message_sep|>\n\nfunction call<|role_sep|>"
R1_CALLS, R1_CALLS_END = "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"
R1_CALL, R1_CALL_END, R1_SEP = "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>", "<｜tool▁sep｜>"
K2_SECTION, K2_SECTION_END = "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>"
K2_CALL, K2_ARGS, K2_CALL_END = ("<|tool_call_begin|>", "<|tool_call_argument_begin|>",
                                 "<|tool_call_end|>")
STRING_TYPES = {"string", "str", "text", "varchar", "char", "enum"}  # mlx-lm's qwen3_coder


def tool_name(cur: Cursor, syntax: ChatSyntax) -> str:
    """A declared tool's name, the longest that comes next."""
    rest = cur.rest
    names = sorted((str(t["name"]) for t in syntax.tools), key=len, reverse=True)
    for name in names:
        if rest.startswith(name):
            cur.pos += len(name)
            return name
    if any(name.startswith(rest) for name in names):
        raise Incomplete
    raise Mismatch


def json_arguments(cur: Cursor, call: ToolCall) -> None:
    """The call's JSON object, as far as it got."""
    start = cur.pos
    try:
        call.arguments = cur.value()
    except Incomplete:
        call.arguments = cur.text[start:] or "{"
        raise
    json_object(call.arguments)


def is_string(syntax: ChatSyntax, tool: str, param: str) -> bool:
    schema = ((syntax.tool(tool) or {}).get("parameters") or {}).get("properties", {})
    kind = schema.get(param, {}).get("type", "string") if isinstance(schema, dict) else "string"
    return str(kind).strip().lower() in STRING_TYPES


def escaped(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)[1:-1]


def _mistral_args(cur: Cursor, syntax: ChatSyntax, calls: Calls) -> None:
    """``[TOOL_CALLS]NAME[ARGS]{...}`` per call (Devstral, Ministral 3, Magistral), or with
    ``[CALL_ID]ID`` before ``[ARGS]`` (Mistral Small 3.2), whose id is kept."""
    while True:
        cur.expect("[TOOL_CALLS]")
        call = ToolCall(tool_name(cur, syntax), "{")
        if cur.peek("[CALL_ID]"):
            cur.expect("[CALL_ID]")
            call.id = cur.until("[ARGS]")
        else:
            cur.expect("[ARGS]")
        calls.append(call)
        json_arguments(cur, call)
        cur.ws()
        if cur.at_end():
            return


def _kimi_k2(cur: Cursor, syntax: ChatSyntax, calls: Calls) -> None:
    """``<|tool_calls_section_begin|><|tool_call_begin|>functions.NAME:I
    <|tool_call_argument_begin|>{...}<|tool_call_end|>...<|tool_calls_section_end|>``; the id
    ``functions.NAME:I`` is kept."""
    cur.expect(K2_SECTION)
    while True:
        cur.ws()
        if cur.peek(K2_SECTION_END):
            end_of(cur, K2_SECTION_END)
            return
        cur.expect(K2_CALL)
        prefix = "functions." if cur.peek("functions.") else ""
        cur.pos += len(prefix)
        name = tool_name(cur, syntax)
        cur.expect(":")
        index = cur.until(K2_ARGS)
        call = ToolCall(name, "{", f"{prefix}{name}:{index.strip()}")
        calls.append(call)
        json_arguments(cur, call)
        cur.ws()
        cur.expect(K2_CALL_END)


def end_of(cur: Cursor, marker: str) -> None:
    cur.expect(marker)
    cur.ws()
    if not cur.at_end():
        raise Mismatch


def _functionary_v3_1(cur: Cursor, syntax: ChatSyntax, calls: Calls) -> None:
    """``<function=NAME>{...}</function>`` per call (Functionary v3.1 on Llama 3.1)."""
    while True:
        cur.expect("<function=")
        call = ToolCall(tool_name(cur, syntax), "{")
        cur.expect(">")
        calls.append(call)
        json_arguments(cur, call)
        cur.expect("</function>")
        cur.ws()
        if cur.at_end():
            return


def _apertus(cur: Cursor, syntax: ChatSyntax, calls: Calls) -> None:
    """``<|tools_prefix|>[{"NAME": {...}}, ...]<|tools_suffix|>``."""
    cur.expect("<|tools_prefix|>")
    cur.ws()
    cur.expect("[")
    while True:
        cur.ws()
        cur.expect("{")
        cur.ws()
        name = cur.string()
        if syntax.tool(name) is None:
            raise Mismatch
        cur.ws()
        cur.expect(":")
        cur.ws()
        call = ToolCall(name, "{")
        calls.append(call)
        json_arguments(cur, call)
        cur.ws()
        cur.expect("}")
        cur.ws()
        if not cur.peek(","):
            break
        cur.expect(",")
    cur.expect("]")
    cur.ws()
    end_of(cur, "<|tools_suffix|>")


def json_object_calls(opening: str, closing: str = "", each: str = "") -> Callable:
    """``OPENING {"name": N, "arguments": {...}}`` (several, one per line, up to CLOSING when
    there is one; each after EACH when there is one)."""
    def read(cur: Cursor, syntax: ChatSyntax, calls: Calls) -> None:
        cur.expect(opening)
        while True:
            cur.ws()
            if closing and cur.peek(closing):
                end_of(cur, closing)
                return
            if each:
                cur.expect(each)
                cur.ws()
            _json_list_call(cur, syntax, calls, ("name", "arguments", ""))
            cur.ws()
            if cur.at_end() and not closing:
                return
    return read


def _solar(cur: Cursor, syntax: ChatSyntax, calls: Calls) -> None:
    """``<|tool_calls|><|tool_call:begin|>ID<|tool_call:name|>N<|tool_call:args|>{...}
    <|tool_call:end|>...`` (Solar Open); the id is kept."""
    cur.expect("<|tool_calls|>")
    while True:
        cur.ws()
        if cur.at_end():
            return
        if cur.peek("<|calls|>"):
            end_of(cur, "<|calls|>")
            return
        cur.expect("<|tool_call:begin|>")
        call_id = cur.until("<|tool_call:name|>")
        call = ToolCall(tool_name(cur, syntax), "{", call_id.strip())
        cur.expect("<|tool_call:args|>")
        calls.append(call)
        json_arguments(cur, call)
        cur.expect("<|tool_call:end|>")


def json_list(opening: str, closing: str, name_key: str = "name",
              args_key: str = "arguments", id_key: str = "") -> Callable:
    """``OPENING[{NAME_KEY: N, ARGS_KEY: {...}[, ID_KEY: I]}, ...]CLOSING``, keys in any
    order; a call is listed once its name is read."""
    def read(cur: Cursor, syntax: ChatSyntax, calls: Calls) -> None:
        cur.expect(opening)
        cur.ws()
        cur.expect("[")
        while True:
            cur.ws()
            _json_list_call(cur, syntax, calls, (name_key, args_key, id_key))
            cur.ws()
            if not cur.peek(","):
                break
            cur.expect(",")
        cur.expect("]")
        cur.ws()
        end_of(cur, closing)
    return read


def _json_list_call(cur: Cursor, syntax: ChatSyntax, calls: Calls,
                    keys: tuple[str, str, str]) -> None:
    name_key, args_key, id_key = keys
    cur.expect("{")
    call = ToolCall("", "{")
    call_id = ""
    first = True
    while True:
        cur.ws()
        if cur.peek("}"):
            cur.expect("}")
            break
        if not first:
            cur.expect(",")
            cur.ws()
        first = False
        key = cur.string()
        cur.ws()
        cur.expect(":")
        cur.ws()
        if key == name_key:
            name = cur.string()
            if syntax.tool(name) is None or call.name:
                raise Mismatch
            call.name, call.id = name, call_id
            calls.append(call)
        elif key == args_key and call.name:
            json_arguments(cur, call)
        elif key == id_key:
            call_id = json.loads(cur.value()) if id_key else ""
            call.id = str(call_id)
        else:
            raise Mismatch
    if not call.name:
        raise Mismatch


def _deepseek_v3_1(cur: Cursor, syntax: ChatSyntax, calls: Calls) -> None:
    """``<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>NAME<｜tool▁sep｜>{...}<｜tool▁call▁end｜>...
    <｜tool▁calls▁end｜>``."""
    cur.expect(R1_CALLS)
    while True:
        cur.ws()
        if cur.peek(R1_CALLS_END):
            end_of(cur, R1_CALLS_END)
            return
        cur.expect(R1_CALL)
        call = ToolCall(tool_name(cur, syntax), "{")
        cur.expect(R1_SEP)
        calls.append(call)
        json_arguments(cur, call)
        cur.expect(R1_CALL_END)


def functionary_v3_2(text: str, syntax: ChatSyntax, partial: bool, hold: bool) -> ChatMessage:
    """``>>>all\nTEXT`` is content, ``>>>NAME\n{...}`` a call; the generation prompt writes
    the first ``>>>``, so the text may start past it."""
    out = ChatMessage()
    cur = Cursor(text if text.startswith(">>>") or not text else ">>>" + text)
    try:
        while not cur.at_end():
            cur.expect(">>>")
            if cur.peek("all\n"):
                cur.expect("all\n")
                found = cur.text.find(">>>", cur.pos)
                body = cur.text[cur.pos:] if found < 0 else cur.text[cur.pos:found]
                cur.pos = len(cur.text) if found < 0 else found
                out.content += held_back(body, ">>>") if hold and found < 0 else body
                continue
            call = ToolCall(tool_name(cur, syntax), "{")
            cur.expect("\n")
            out.tool_calls.append(call)
            json_arguments(cur, call)
            cur.ws()
    except (Incomplete, Mismatch):
        if not partial:
            raise ParseFailure() from None
    return out


FAMILIES: dict[str, tuple[tuple[str, ...], Callable]] = {
    APERTUS: (("<|tools_prefix|>",), _apertus),
    GIGACHAT3: ((GIGACHAT3_CALL,), json_object_calls(GIGACHAT3_CALL)),
    GIGACHAT3_1: (("<|function_call|>",), json_object_calls("<|function_call|>")),
    MINIMAX_M1: (("<tool_calls>",), json_object_calls("<tool_calls>", "</tool_calls>")),
    SOLAR: (("<|tool_calls|>",), _solar),
    MISTRAL_ARGS: (("[TOOL_CALLS]",), _mistral_args),
    KIMI_K2: ((K2_SECTION,), _kimi_k2),
    FUNCTIONARY_V3_1: (("<function=",), _functionary_v3_1),
    APRIEL: (("<tool_calls>",), json_list("<tool_calls>", "</tool_calls>")),
    NEMOTRON_V2: (("<TOOLCALL>",), json_list("<TOOLCALL>", "</TOOLCALL>")),
    COMMAND_R7B: (("<|START_ACTION|>",), json_list("<|START_ACTION|>", "<|END_ACTION|>",
                                                   "tool_name", "parameters",
                                                   "tool_call_id")),
    DEEPSEEK_V3_1: ((R1_CALLS,), _deepseek_v3_1),
}
