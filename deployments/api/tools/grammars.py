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
from dataclasses import dataclass, field

from deployments.api.tools.families import (
    FAMILIES,
    K2_ARGS,
    K2_CALL,
    K2_CALL_END,
    K2_SECTION,
    K2_SECTION_END,
    R1_CALL,
    R1_CALL_END,
    R1_CALLS,
    R1_CALLS_END,
    R1_SEP,
)
from deployments.api.tools.family_grammars import FAMILY_RULES
from deployments.api.tools.lark_rules import Lark, SpecialToken, regex_text, tagged_rules, tool_args
from deployments.api.tools.syntax import (
    APERTUS,
    APRIEL,
    COMMAND_R7B,
    DEEPSEEK_R1,
    DEEPSEEK_V3_1,
    DSML,
    FUNCTIONARY_V3_1,
    FUNCTIONARY_V3_2,
    GEMMA4,
    GIGACHAT3,
    GIGACHAT3_1,
    GLM,
    GPT_OSS,
    HERMES,
    HUNYUAN,
    KIMI_K2,
    LFM2,
    LLAMA3,
    MINICPM5,
    MINIMAX_M1,
    MINIMAX_M2,
    MINIMAX_M3,
    MISTRAL,
    MISTRAL_ARGS,
    NEMOTRON_V2,
    QWEN3_CODER,
    SEED_OSS,
    SOLAR,
    ChatSyntax,
)
from deployments.api.tools.tagged import DSML_BAR, MM, TAGGED
from engine.types import TRIGGER_WORD

# Special-token markers of each format: rendered as text in the output (preserved tokens).
MARKERS: dict[str, tuple[str, ...]] = {
    HERMES: ("<tool_call>", "</tool_call>"),
    QWEN3_CODER: ("<tool_call>", "</tool_call>"),
    LLAMA3: ("<|python_tag|>",),
    MISTRAL: ("[TOOL_CALLS]", "[ARGS]", "[CALL_ID]"),
    DEEPSEEK_R1: (R1_CALLS, R1_CALLS_END, R1_CALL, R1_CALL_END, R1_SEP),
    GPT_OSS: ("<|channel|>", "<|constrain|>", "<|message|>", "<|start|>", "<|end|>",
              "<|call|>"),
    MISTRAL_ARGS: ("[TOOL_CALLS]", "[ARGS]", "[CALL_ID]"),
    GLM: ("<tool_call>", "</tool_call>", "<arg_key>", "</arg_key>", "<arg_value>",
          "</arg_value>"),
    KIMI_K2: (K2_SECTION, K2_SECTION_END, K2_CALL, K2_ARGS, K2_CALL_END),
    MINIMAX_M2: ("<minimax:tool_call>", "</minimax:tool_call>"),
    SEED_OSS: ("<seed:tool_call>", "</seed:tool_call>"),
    FUNCTIONARY_V3_1: ("<function=",),
    APRIEL: ("<tool_calls>", "</tool_calls>"),
    NEMOTRON_V2: ("<TOOLCALL>", "</TOOLCALL>"),
    COMMAND_R7B: ("<|START_ACTION|>", "<|END_ACTION|>"),
    DEEPSEEK_V3_1: (R1_CALLS, R1_CALLS_END, R1_CALL, R1_CALL_END, R1_SEP),
    APERTUS: ("<|tools_prefix|>", "<|tools_suffix|>"),
    GIGACHAT3: ("<|message_sep|>", "<|role_sep|>"),
    GIGACHAT3_1: ("<|function_call|>",),
    MINIMAX_M1: ("<tool_calls>", "</tool_calls>"),
    SOLAR: ("<|tool_calls|>", "<|tool_call:begin|>", "<|tool_call:name|>", "<|tool_call:args|>",
            "<|tool_call:end|>", "<|calls|>"),
    MINICPM5: (),
    HUNYUAN: ("<tool_calls:opensource>", "</tool_calls:opensource>", "<tool_call:opensource>",
              "</tool_call:opensource>", "<tool_sep:opensource>", "<arg_key:opensource>",
              "</arg_key:opensource>", "<arg_value:opensource>", "</arg_value:opensource>"),
    # parsed, not constrained (no grammar yet: docs/tools.md)
    DSML: (f"<{DSML_BAR}function_calls>", f"</{DSML_BAR}function_calls>",
           f"<{DSML_BAR}tool_calls>", f"</{DSML_BAR}tool_calls>"),
    MINIMAX_M3: (MM,),
    GEMMA4: ("<|tool_call>", "<tool_call|>", '<|"|>'),
    LFM2: ("<|tool_call_start|>", "<|tool_call_end|>"),
    FUNCTIONARY_V3_2: (),
}


@dataclass
class Constraint:
    """The native request's grammar fields for one chat request."""

    grammar: str = ""
    lazy: bool = False
    triggers: list[dict] = field(default_factory=list)
    preserved: list[str] = field(default_factory=list)


def _json_calls(lark: Lark, tools: list[dict], head: str, key: str, tail: str, sep: str,
                parallel: bool, suffix: str = "") -> list[str]:
    """Rules of formats whose call is ``head {"name": N, key: ARGS[suffix]} tail``."""
    rules = []
    for i, tool in enumerate(tools):
        name = json.dumps(tool["name"], ensure_ascii=False)
        opening = lark.lit(head + '{"name": ' + name + ', "' + key + '": ')
        rules.append(f"fn{i}: {opening} args{i} {suffix}{lark.lit('}' + tail)}")
        rules.append(f"args{i}: {tool_args(tool)}")
    rules.insert(0, "call: " + " | ".join(f"fn{i}" for i in range(len(tools))))
    rules.insert(0, f"calls: call ({lark.lit(sep)} call)*" if parallel else "calls: call")
    return rules


def _qwen3_coder(lark: Lark, tools: list[dict], parallel: bool) -> list[str]:
    """``<tool_call>\n<function=N>\n<parameter=P>\nV\n</parameter>\n...</function>\n
    </tool_call>``, the wrapper optional (the reference's first call may omit it)."""
    wrapped = f"{lark.lit('<tool_call>' + chr(10))} fn {lark.lit(chr(10) + '</tool_call>')}"
    return ([f"calls: call ({lark.lit(chr(10))} call)*" if parallel else "calls: call",
             f"call: {wrapped} | fn",
             "fn: " + " | ".join(f"fn{i}" for i in range(len(tools)))]
            + tagged_rules(lark, tools, lambda n: f"<function={n}>\n",
                      lambda p, _: (f"<parameter={p}>\n", "\n</parameter>\n"), "</function>",
                      "TEXT"))


def _gpt_oss(lark: Lark, tools: list[dict]) -> list[str]:
    rules = ["calls: call", "call: " + " | ".join(f"fn{i}" for i in range(len(tools)))]
    for i, tool in enumerate(tools):
        head = f"<|channel|>commentary to=functions.{tool['name']} <|constrain|>json<|message|>"
        rules += [f"fn{i}: {lark.lit(head)} args{i}", f"args{i}: {tool_args(tool)}"]
    return rules


def _call_rules(fmt: str, lark: Lark, tools: list[dict], parallel: bool) -> list[str]:
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
                      f"args{i}: {tool_args(tool)}"]
        calls = "call (\"\\n\" call)*" if parallel else "call"
        return [f"calls: {lark.lit(R1_CALLS)} {calls} {lark.lit(R1_CALLS_END)}",
                "call: " + " | ".join(f"fn{i}" for i in range(len(tools)))] + rules
    if fmt == QWEN3_CODER:
        return _qwen3_coder(lark, tools, parallel)
    if fmt in FAMILY_RULES:
        return FAMILY_RULES[fmt](lark, tools, parallel)
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
    if fmt in FAMILIES or fmt in TAGGED:
        return list({**FAMILIES, **TAGGED}[fmt][0])
    return []


BUILT_IN = (HERMES, LLAMA3, MISTRAL, DEEPSEEK_R1, QWEN3_CODER, GPT_OSS)


def has_grammar(fmt: str) -> bool:
    """Whether the format's calls are constrained (the others are parsed only)."""
    return fmt in BUILT_IN or fmt in FAMILY_RULES


def tool_constraint(syntax: ChatSyntax, tools: list[dict], lazy: bool, parallel: bool,
                    special: SpecialToken) -> Constraint:
    """The grammar over ``tools`` (all of them, or the named one) for ``syntax``'s format."""
    fmt = syntax.format
    markers = MARKERS.get(fmt, ()) + ((syntax.think_start, syntax.think_end)
                                      if syntax.thinks else ())
    words = triggers(fmt, tools)
    if not tools or not has_grammar(fmt) or (lazy and not words):
        return Constraint(preserved=list(markers))
    lark = Lark(markers, special)
    rules = _call_rules(fmt, lark, tools, parallel)
    first = "" if lazy else _reasoning_first(syntax, lark)
    if first:
        rules.append(thought_rule(syntax.think_end))
    grammar = "%llguidance {}\nstart: " + first + "calls\n" + "\n".join(rules) + "\n"
    return Constraint(grammar, lazy, [{"type": TRIGGER_WORD, "value": w} for w in words],
                      list(markers))


def _reasoning_first(syntax: ChatSyntax, lark: Lark) -> str:
    """Reasoning the generation prompt opened comes first, up to its end tag."""
    if syntax.format == GPT_OSS:
        lark_end = lark.lit("<|end|><|start|>assistant")
        return f"({lark.lit('<|channel|>analysis<|message|>')} THOUGHT {lark_end})? "
    if not (syntax.reasoning and syntax.in_reasoning):
        return ""
    return f"THOUGHT {lark.lit(syntax.think_end)} /[ \\t\\n]{{0,2}}/ "


def thought_rule(end: str) -> str:
    """Reasoning: any text without the end tag (nor harmony's ``<|end|>``)."""
    return f"THOUGHT: /(?s:.*)/ & ~/(?s:.*)({regex_text(end)}|<\\|end\\|>)(?s:.*)/"
