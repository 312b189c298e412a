"""Generated text -> (reasoning, content, tool calls), per format, as llama-server parses it.

``parse(text, syntax, partial)`` reads the whole text; with ``partial`` (a stream in progress,
or output cut by the token limit) a construct the text ends inside is kept as far as it got
and a marker it may still become is held back, so re-parsing after every token only ever adds
text (spec §4). Without it, output the format does not allow raises ``ParseFailure``.

JSON formats keep the model's argument text as it is; the tagged XML format builds compact
JSON. mlx-lm's tool parsers (``mlx_lm/tool_parsers``) read only whole calls between markers,
so they cannot stream llama-server's argument fragments; the Qwen3-Coder parameter typing
follows its ``qwen3_coder`` parser's type names.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable

from deployments.api.tools.families import (
    FAMILIES,
    R1_CALL,
    R1_CALL_END,
    R1_CALLS,
    R1_CALLS_END,
    R1_SEP,
    functionary_v3_2,
    json_arguments,
)
from deployments.api.tools.scan import Cursor, Incomplete, Mismatch, held_back, json_object
from deployments.api.tools.syntax import (
    DEEPSEEK_R1,
    FUNCTIONARY_V3_2,
    GPT_OSS,
    HERMES,
    LLAMA3,
    MISTRAL,
    QWEN3_CODER,
    ChatMessage,
    ChatSyntax,
    ParseFailure,
    ToolCall,
)
from deployments.api.tools.tagged import TAGGED, tagged_arguments

Calls = list[ToolCall]
ReadCalls = Callable[[Cursor, ChatSyntax, Calls], None]


def parse(text: str, syntax: ChatSyntax, partial: bool, hold: bool | None = None) -> ChatMessage:
    """``hold`` (default: ``partial``) holds back a tail that may become a marker; output cut by
    the token limit is parsed partial (a half-written call is kept) without holding back."""
    hold = partial if hold is None else hold
    if syntax.format == GPT_OSS:
        return _harmony(text, syntax, partial, hold)
    if syntax.format == FUNCTIONARY_V3_2 and syntax.parse_tools:
        return functionary_v3_2(text, syntax, partial, hold)
    reasoning, rest = split_reasoning(text, syntax, partial, hold)
    if syntax.json_only and not partial:
        _check_json(rest)
    if not syntax.parse_tools or syntax.format not in FORMATS:
        return ChatMessage(rest, reasoning)
    triggers, read = FORMATS[syntax.format]
    content, calls = _content_then_calls(rest, syntax, partial, hold, triggers, read)
    return ChatMessage(content, reasoning, calls)


def _check_json(text: str) -> None:
    """With a response schema and tools, the content is the schema's JSON, optionally fenced;
    anything else (a tool call) fails as in the reference."""
    body = text.strip()
    if body.startswith("```json") and body.endswith("```"):
        body = body[7:-3]
    try:
        json.loads(body)
    except ValueError:
        raise ParseFailure() from None


def split_reasoning(text: str, syntax: ChatSyntax, partial: bool,
                    hold: bool = True) -> tuple[str, str]:
    """(reasoning, the rest): reasoning opens at the start (or in the generation prompt) with
    the start tag and ends at the end tag."""
    if not syntax.reasoning:
        return "", text
    start, end = syntax.think_start, syntax.think_end
    if syntax.in_reasoning:
        body = text
    else:
        lead = text.lstrip() if syntax.trim else text
        if lead.startswith(start):
            body = lead[len(start):]
        elif hold and lead and start.startswith(lead):
            return "", ""
        else:
            return "", text
    if syntax.trim:
        body = body.lstrip()
    found = body.find(end)
    if found < 0:
        return (held_back(body, end) if hold else body), ""
    rest = body[found + len(end):]
    return body[:found], rest.lstrip() if syntax.trim else rest


def _content_then_calls(text: str, syntax: ChatSyntax, partial: bool, hold: bool,
                        triggers: tuple[str, ...], read: ReadCalls) -> tuple[str, Calls]:
    found = [i for i in (text.find(t) for t in triggers) if i >= 0]
    if not found:
        return (held_back(text, *triggers) if hold else text), []
    start = min(found)
    calls: Calls = []
    try:
        read(Cursor(text, start), syntax, calls)
    except (Incomplete, Mismatch):
        if not partial:
            raise ParseFailure() from None
    return text[:start], calls


def _json_call(cur: Cursor, syntax: ChatSyntax, calls: Calls, args_keys: tuple[str, ...],
               with_id: bool = False) -> ToolCall:
    """``{"name": N, "arguments": {...}`` (key order as the reference requires), the call
    listed once its name and the comma after it are there; ``with_id``: then
    ``, "id": "..."``, and the call is listed only once its id is read. Leaves the cursor
    before the closing brace."""
    cur.expect("{")
    cur.ws()
    if cur.string() != "name":
        raise Mismatch
    cur.ws()
    cur.expect(":")
    cur.ws()
    name = cur.string()
    if syntax.tool(name) is None:
        raise Mismatch
    call = ToolCall(name, "{")
    cur.ws()
    cur.expect(",")  # the reference lists the call once the comma after its name came
    if not with_id:
        calls.append(call)
    cur.ws()
    if cur.string() not in args_keys:
        raise Mismatch
    cur.ws()
    cur.expect(":")
    cur.ws()
    json_arguments(cur, call)
    cur.ws()
    if with_id:
        cur.expect(",")
        cur.ws()
        if cur.string() != "id":
            raise Mismatch
        cur.ws()
        cur.expect(":")
        cur.ws()
        call.id = cur.string()
        calls.append(call)
        cur.ws()
    return call


def _hermes(cur: Cursor, syntax: ChatSyntax, calls: Calls) -> None:
    while True:
        cur.expect("<tool_call>\n")
        cur.ws()
        _json_call(cur, syntax, calls, ("arguments",))
        cur.expect("}")
        cur.ws()
        cur.expect("</tool_call>")
        cur.ws()
        if cur.at_end():
            return


def _llama3(cur: Cursor, syntax: ChatSyntax, calls: Calls) -> None:
    while True:
        _json_call(cur, syntax, calls, ("parameters", "arguments"))
        cur.expect("}")
        cur.ws()
        if cur.at_end():
            return
        if cur.peek(";"):
            cur.expect(";")
            cur.ws()


def _mistral(cur: Cursor, syntax: ChatSyntax, calls: Calls) -> None:
    cur.expect("[TOOL_CALLS]")
    cur.ws()
    cur.expect("[")
    while True:
        cur.ws()
        _json_call(cur, syntax, calls, ("arguments",), with_id=True)
        cur.expect("}")
        cur.ws()
        if not cur.peek(","):
            break
        cur.expect(",")
    cur.expect("]")
    cur.ws()
    if not cur.at_end():
        raise Mismatch


def _deepseek_r1(cur: Cursor, syntax: ChatSyntax, calls: Calls) -> None:
    cur.expect(R1_CALLS)
    while True:
        cur.ws()
        if cur.peek(R1_CALLS_END):
            cur.expect(R1_CALLS_END)
            cur.ws()
            if not cur.at_end():
                raise Mismatch
            return
        cur.expect(f"{R1_CALL}function{R1_SEP}")
        name = cur.until("\n")
        if syntax.tool(name) is None:
            raise Mismatch
        call = ToolCall(name, "{")
        calls.append(call)
        cur.expect("```json\n")
        json_arguments(cur, call)
        cur.expect("\n```")
        cur.expect(R1_CALL_END)


def _qwen3_coder(cur: Cursor, syntax: ChatSyntax, calls: Calls) -> None:
    while True:
        wrapped = cur.peek("<tool_call>")
        if wrapped:
            cur.expect("<tool_call>")
            cur.ws()
        cur.expect("<function=")
        name = cur.until(">")
        cur.expect("\n")
        if syntax.tool(name) is None:  # the reference drops an unknown function silently
            cur.until("</function>")
        else:
            _xml_arguments(cur, syntax, calls, name)
        cur.ws()
        if wrapped:
            cur.expect("</tool_call>")
            cur.ws()
        if cur.at_end():
            return


def _xml_arguments(cur: Cursor, syntax: ChatSyntax, calls: Calls, name: str) -> None:
    tagged_arguments(cur, syntax, calls, name, ("<parameter=", ">\n", "", "\n</parameter>"),
                     "</function>")


# ---- GPT-OSS (harmony) ----------------------------------------------------------------------
HARMONY_ENDS = ("<|end|>", "<|call|>", "<|return|>")
_RECIPIENT = re.compile(r"to=functions\.([^\s<]+)")


def _harmony(text: str, syntax: ChatSyntax, partial: bool, hold: bool) -> ChatMessage:
    """Messages ``[<|start|>assistant[ to=functions.N]]<|channel|>C[ to=functions.N]
    [ <|constrain|>json]<|message|>BODY<|end|>``: analysis is reasoning, final and plain
    commentary are content, a commentary to a function is the (one, last) tool call."""
    out = ChatMessage()
    cur = Cursor(text)
    try:
        while not cur.at_end():
            if out.tool_calls:
                raise Mismatch  # the call comes last
            role = ""
            if cur.peek("<|start|>"):
                cur.expect("<|start|>assistant")
                role = cur.until("<|channel|>")
            elif cur.pos == 0 and cur.peek(" to="):  # the prompt's <|start|>assistant goes on
                role = cur.until("<|channel|>")
            else:
                cur.expect("<|channel|>")
            header = cur.until("<|message|>")
            body, ended = _harmony_body(cur, hold)
            _harmony_message(out, syntax, role + " " + header, body, ended)
    except (Incomplete, Mismatch):
        if not partial:
            raise ParseFailure() from None
    return out


def _harmony_body(cur: Cursor, hold: bool) -> tuple[str, bool]:
    ends = [(i, m) for m in HARMONY_ENDS if (i := cur.text.find(m, cur.pos)) >= 0]
    if not ends:
        rest = cur.rest
        cur.pos = len(cur.text)
        return (held_back(rest, *HARMONY_ENDS) if hold else rest), False
    index, marker = min(ends)
    body = cur.text[cur.pos:index]
    cur.pos = index + len(marker)
    return body, True


def _harmony_message(out: ChatMessage, syntax: ChatSyntax, header: str, body: str,
                     ended: bool) -> None:
    channel = header.split("<|", 1)[0].split()
    recipient = _RECIPIENT.search(header)
    if recipient is not None and syntax.parse_tools:
        if syntax.tool(recipient.group(1)) is None:
            raise Mismatch
        out.tool_calls.append(ToolCall(recipient.group(1), body or "{"))
        if ended:
            json_object(body)
    elif channel and channel[0] == "analysis" and syntax.reasoning:
        out.reasoning_content += body
    elif recipient is None:
        out.content += body


FORMATS: dict[str, tuple[tuple[str, ...], ReadCalls]] = {
    HERMES: (("<tool_call>\n",), _hermes),
    QWEN3_CODER: (("<tool_call>", "<function="), _qwen3_coder),
    LLAMA3: (("{",), _llama3),
    MISTRAL: (("[TOOL_CALLS]",), _mistral),
    DEEPSEEK_R1: ((R1_CALLS,), _deepseek_r1),
    **FAMILIES,
    **TAGGED,
}
