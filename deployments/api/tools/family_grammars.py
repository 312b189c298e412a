"""The grammars of the formats in ``families.py`` and ``tagged.py`` that are constrained, built
from ``lark_rules``' shapes."""

from __future__ import annotations

from collections.abc import Callable

from deployments.api.tools.families import (
    GIGACHAT3_CALL,
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
from deployments.api.tools.lark_rules import (
    Lark,
    calls_rules,
    json_in,
    quoted,
    tagged_calls,
)
from deployments.api.tools.syntax import (
    APERTUS,
    APRIEL,
    COMMAND_R7B,
    DEEPSEEK_V3_1,
    FUNCTIONARY_V3_1,
    GIGACHAT3,
    GIGACHAT3_1,
    GLM,
    HUNYUAN,
    KIMI_K2,
    MINICPM5,
    MINIMAX_M1,
    MINIMAX_M2,
    MISTRAL_ARGS,
    NEMOTRON_V2,
    SEED_OSS,
    SOLAR,
)


def _single(rules: Callable) -> Callable:
    """One call per turn: the format's reader takes one."""
    return lambda lark, tools, parallel: rules(lark, tools, False)


def _solar(lark: Lark, tools: list[dict], parallel: bool) -> list[str]:
    rules = calls_rules(lark, tools, parallel, lambda i, t: (
        f"{lark.lit('<|tool_call:begin|>')} CALL_ID "
        f"{lark.lit('<|tool_call:name|>' + t['name'] + '<|tool_call:args|>')} args{i} "
        f"{lark.lit('<|tool_call:end|>')}"), "<|tool_calls|>")
    return rules + ["CALL_ID: /[a-zA-Z0-9_]{1,40}/"]


_NAMED_ARGS = '{"name": %s, "arguments": '
FAMILY_RULES: dict[str, Callable[[Lark, list[dict], bool], list[str]]] = {
    APERTUS: json_in("<|tools_prefix|>[", "]<|tools_suffix|>", ", ",
                      lambda t: "{" + quoted(t) + ": ", "}"),
    GIGACHAT3: _single(json_in(GIGACHAT3_CALL + "\n", "", "",
                                lambda t: _NAMED_ARGS % quoted(t), "}")),
    GIGACHAT3_1: _single(json_in("<|function_call|>", "", "",
                                  lambda t: _NAMED_ARGS % quoted(t), "}")),
    MINIMAX_M1: json_in("<tool_calls>\n", "\n</tool_calls>", "\n",
                         lambda t: _NAMED_ARGS % quoted(t), "}"),
    SOLAR: _solar,
    MINICPM5: tagged_calls("", "", "", lambda n: f'<function name="{n}">',
                            lambda p, _: (f'<param name="{p}">', "</param>"), "</function>",
                            "MINICPM_TEXT"),
    HUNYUAN: tagged_calls("<tool_calls:opensource>\n", "\n</tool_calls:opensource>", "\n",
                           lambda n: f"<tool_call:opensource>{n}<tool_sep:opensource>\n",
                           lambda p, _: (f"<arg_key:opensource>{p}</arg_key:opensource>\n"
                                      "<arg_value:opensource>", "</arg_value:opensource>\n"),
                           "</tool_call:opensource>", "HUNYUAN_TEXT"),
    MISTRAL_ARGS: json_in("", "", "", lambda t: "[TOOL_CALLS]" + t["name"] + "[ARGS]", ""),
    GLM: tagged_calls("", "", "\n", lambda n: f"<tool_call>{n}\n",
                       lambda p, _: (f"<arg_key>{p}</arg_key>\n<arg_value>", "</arg_value>\n"),
                       "</tool_call>", "GLM_TEXT"),
    KIMI_K2: json_in(K2_SECTION, K2_SECTION_END, "",
                      lambda t: f"{K2_CALL}functions.{t['name']}:0{K2_ARGS}", K2_CALL_END),
    MINIMAX_M2: tagged_calls("<minimax:tool_call>\n", "\n</minimax:tool_call>", "\n",
                              lambda n: f'<invoke name="{n}">\n',
                              lambda p, _: (f'<parameter name="{p}">', "</parameter>\n"),
                              "</invoke>", "MINIMAX_TEXT"),
    SEED_OSS: tagged_calls("", "", "\n", lambda n: f"<seed:tool_call>\n<function={n}>\n",
                            lambda p, _: (f"<parameter={p}>", "</parameter>\n"),
                            "</function>\n</seed:tool_call>", "SEED_TEXT"),
    FUNCTIONARY_V3_1: json_in("", "", "", lambda t: f"<function={t['name']}>", "</function>"),
    APRIEL: json_in("<tool_calls>[", "]</tool_calls>", ", ",
                     lambda t: '{"name": ' + quoted(t) + ', "arguments": ', "}"),
    NEMOTRON_V2: json_in("<TOOLCALL>[", "]</TOOLCALL>", ", ",
                          lambda t: '{"name": ' + quoted(t) + ', "arguments": ', "}"),
    COMMAND_R7B: json_in("<|START_ACTION|>[", "]<|END_ACTION|>", ", ",
                          lambda t: '{"tool_call_id": "0", "tool_name": ' + quoted(t)
                          + ', "parameters": ', "}"),
    DEEPSEEK_V3_1: json_in(R1_CALLS, R1_CALLS_END, "", lambda t: R1_CALL + t["name"] + R1_SEP,
                            R1_CALL_END),
}
