"""What the chat path knows about one request's output: the tool-call format the chat template
speaks, the tools, and how reasoning is split (llama-server's ``common_chat_syntax``).

A ``ChatSyntax`` crosses the Ray call to the response shaper inside the OpenAI context; the
shaper parses the generated text with it (``deployments/api/tools/parsers.py``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

# Format names, one per family of chat templates (spec §2).
CONTENT = "content"
HERMES = "hermes"  # <tool_call>\n{"name": ..., "arguments": ...}\n</tool_call> (Qwen2.5, Qwen3)
QWEN3_CODER = "qwen3_coder"  # <tool_call>\n<function=N>\n<parameter=P>\nV\n</parameter>...
LLAMA3 = "llama3"  # a bare {"name": ..., "parameters": ...}
MISTRAL = "mistral"  # [TOOL_CALLS][{"name": ..., "arguments": ..., "id": ...}]
DEEPSEEK_R1 = "deepseek_r1"  # <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>N
GPT_OSS = "gpt_oss"  # harmony channels
# deployments/api/tools/families.py
MISTRAL_ARGS = "mistral_args"  # [TOOL_CALLS]N[ARGS]{...} (Devstral, Ministral 3, Small 3.2)
GLM = "glm"  # <tool_call>N<arg_key>K</arg_key><arg_value>V</arg_value></tool_call>
KIMI_K2 = "kimi_k2"  # <|tool_calls_section_begin|><|tool_call_begin|>functions.N:0...
MINIMAX_M2 = "minimax_m2"  # <minimax:tool_call><invoke name="N"><parameter name="K">V...
SEED_OSS = "seed_oss"  # <seed:tool_call><function=N><parameter=K>V</parameter>...
FUNCTIONARY_V3_2 = "functionary_v3_2"  # >>>N\n{...} and >>>all\ntext
FUNCTIONARY_V3_1 = "functionary_v3_1"  # <function=N>{...}</function>
APRIEL = "apriel"  # <tool_calls>[{"name": N, "arguments": {...}}]</tool_calls>
NEMOTRON_V2 = "nemotron_v2"  # <TOOLCALL>[{"name": N, "arguments": {...}}]</TOOLCALL>
COMMAND_R7B = "command_r7b"  # <|START_ACTION|>[{"tool_call_id", "tool_name", "parameters"}]
APERTUS = "apertus"  # <|tools_prefix|>[{"N": {...}}]<|tools_suffix|>
GIGACHAT3 = "gigachat3"  # <|message_sep|>\n\nfunction call<|role_sep|>\n{"name", "arguments"}
GIGACHAT3_1 = "gigachat3_1"  # <|function_call|>{"name", "arguments"}
MINIMAX_M1 = "minimax_m1"  # <tool_calls>\n{"name", "arguments"}\n...</tool_calls>
SOLAR = "solar_open"  # <|tool_calls|><|tool_call:begin|>ID<|tool_call:name|>N<|tool_call:args|>
# deployments/api/tools/tagged.py
MINICPM5 = "minicpm5"  # <function name="N"><param name="K">V</param></function>
HUNYUAN = "hunyuan"  # <tool_calls:opensource><tool_call:opensource>N<tool_sep:opensource>...
DSML = "deepseek_dsml"  # <｜DSML｜function_calls><｜DSML｜invoke name="N">... (V3.2, V4)
MINIMAX_M3 = "minimax_m3"  # ]<]minimax[>[<tool_call>...<invoke name="N">...<K>V</K>
GEMMA4 = "gemma4"  # <|tool_call>call:N{k:<|"|>v<|"|>}<tool_call|>
LFM2 = "lfm2"  # <|tool_call_start|>[N(k='v')]<|tool_call_end|>
DEEPSEEK_V3_1 = "deepseek_v3_1"  # <｜tool▁call▁begin｜>N<｜tool▁sep｜>{...}<｜tool▁call▁end｜>

# Template-source substrings, first match wins (the reference's specialized handlers, then the
# autoparser's families, spec §2).
DETECTION: tuple[tuple[str, tuple[str, ...]], ...] = (
    (GPT_OSS, ("<|channel|>",)),
    (FUNCTIONARY_V3_2, (">>>all",)),
    (MISTRAL_ARGS, ("[TOOL_CALLS]", "[ARGS]")),
    (MISTRAL, ("[TOOL_CALLS]",)),
    (KIMI_K2, ("<|tool_calls_section_begin|>", "<|tool_call_begin|>")),
    (MINIMAX_M2, ("<minimax:tool_call>", "<invoke name=")),
    (SEED_OSS, ("<seed:tool_call>", "<function=")),
    (MINIMAX_M3, ("]<]minimax[>[", "<tool_call>", "<invoke name=")),
    (GLM, ("<tool_call>", "<arg_key>", "<arg_value>")),
    (DSML, ("DSML", "dsml_token")),
    (GEMMA4, ("<|tool_call>call:",)),
    (MINICPM5, ("Tool usage guidelines:", '<function name="', '<param name="')),
    (HUNYUAN, ("<tool_calls:opensource>",)),
    (HUNYUAN, ("<tool_calls{}>", ":opensource")),
    (LFM2, ("<|tool_call_start|>",)),
    (LFM2, ("<|tool_list_start|>", "<|tool_list_end|>")),
    (LFM2, ("List of tools: [",)),
    (QWEN3_CODER, ("<tool_call>", "<function=", "<parameter=")),
    (DEEPSEEK_V3_1, ("<｜tool▁calls▁begin｜>", "tool['function']['name'] + '<｜tool▁sep｜>")),
    (DEEPSEEK_R1, ("<｜tool▁calls▁begin｜>",)),
    (NEMOTRON_V2, ("<TOOLCALL>",)),
    (APRIEL, ("<tool_calls>[",)),
    (MINIMAX_M1, ("<tool_calls>", "</tool_calls>")),
    (APERTUS, ("<|tools_prefix|>",)),
    (GIGACHAT3_1, ("<|role_sep|>", "<|function_call|>")),
    (GIGACHAT3, ("<|role_sep|>", "<|message_sep|>", "function call")),
    (SOLAR, ("<|tool_calls|>", "<|tool_call:begin|>")),
    (COMMAND_R7B, ("<|START_ACTION|>", "tool_name")),
    (HERMES, ("<tool_call>",)),
    (FUNCTIONARY_V3_1, ("<function=", "</function>")),
    (LLAMA3, ("<|start_header_id|>", '"parameters"')),
)


# Reasoning tags by template-source substrings, first match wins (spec §2's handlers).
THINK_TAGS: tuple[tuple[tuple[str, ...], str, str], ...] = (
    (("<seed:think>",), "<seed:think>", "</seed:think>"),  # Seed-OSS
    (("<mm:think>",), "<mm:think>", "</mm:think>"),  # MiniMax-M3
    (("<think{}>", ":opensource"), "<think:opensource>", "</think:opensource>"),  # Hunyuan
    (("[THINK]", "[/THINK]"), "[THINK]", "[/THINK]"),  # Ministral 3, Magistral
    (("<|START_THINKING|>",), "<|START_THINKING|>", "<|END_THINKING|>"),  # Command R7B
    (("<|channel>thought",), "<|channel>thought", "<channel|>"),  # Gemma 4
    (("<think>",), "<think>", "</think>"),
)


def detect_think_tags(source: str) -> tuple[str, str] | None:
    """The reasoning tags a template renders, or None."""
    for needles, start, end in THINK_TAGS:
        if all(needle in source for needle in needles):
            return start, end
    return None


def detect_format(source: str) -> str:
    """The tool-call format a template renders; CONTENT when it renders no tool calls."""
    if "tools" not in source and "<｜tool▁calls▁begin｜>" not in source:  # R1-Distill: no tools
        return CONTENT
    for name, needles in DETECTION:
        if all(needle in source for needle in needles):
            return name
    return CONTENT


@dataclass(frozen=True)
class ChatSyntax:
    """How the generated text of one chat request is parsed."""

    format: str = CONTENT
    tools: tuple[dict, ...] = ()  # {"name", "parameters"} of each declared tool
    parse_tools: bool = False  # tools given, tool_choice not "none", no response schema
    json_only: bool = False  # a response schema won over the tools: the content is its JSON
    thinks: bool = False  # the template renders reasoning tags (they are preserved tokens)
    reasoning: bool = False  # split reasoning out (a thinking template, reasoning_format != none)
    think_start: str = "<think>"
    think_end: str = "</think>"
    in_reasoning: bool = False  # the generation prompt opened the reasoning
    trim: bool = True  # whitespace after the tags is dropped (not for DeepSeek R1)

    @property
    def active(self) -> bool:
        """Whether the output is parsed at all (else it is plain content, unchanged)."""
        return self.parse_tools or self.reasoning or self.json_only or self.format == GPT_OSS

    def tool(self, name: str) -> dict | None:
        return next((t for t in self.tools if t["name"] == name), None)


@dataclass
class ToolCall:
    name: str
    arguments: str = ""  # the JSON text as far as it got
    id: str = ""  # the model's own (Mistral), else generated by the shaper


@dataclass
class ChatMessage:
    """A parsed output: what the assistant message carries."""

    content: str = ""
    reasoning_content: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)


class ParseFailure(Exception):
    """The output does not match the format (the reference's 500 after generation)."""

    def __init__(self, format_name: str = "peg-native"):
        super().__init__(f"The model produced output that does not match the expected "
                         f"{format_name} format")
