"""The tool-call formats beyond the first six (deployments/api/tools/families.py, tagged.py):
each format's call, written as its models write it, parses to the call; re-parsed after every
character it only ever grows, as a stream does; the constrained formats' grammar takes the
call token by token and refuses a tool that was not declared; and the chat templates written
for the tests in those formats are detected and round-trip (compat/templates.py, the command
that makes docs/tools.md's table from the models' own templates)."""

from __future__ import annotations

import json
from pathlib import Path

import llguidance
import llguidance.hf
import pytest

from compat.templates import check_folder
from deployments.api.chat_template import ChatTemplate
from deployments.api.tools.families import FAMILIES
from deployments.api.tools.grammars import has_grammar, tool_constraint
from deployments.api.tools.parsers import parse
from deployments.api.tools.syntax import (
    ChatSyntax,
    ParseFailure,
    detect_format,
    detect_think_tags,
)
from deployments.api.tools.tagged import TAGGED

MODEL = str(Path(__file__).resolve().parents[2] / "models" / "tiny-python")
TEMPLATES = Path(__file__).resolve().parents[1] / "fixtures" / "templates"
TOOLS = ({"name": "get_weather", "parameters": {
             "type": "object", "required": ["location"],
             "properties": {"location": {"type": "string"}, "days": {"type": "integer"}}}},
         {"name": "get_time", "parameters": {"type": "object",
                                             "properties": {"tz": {"type": "string"}}}})
PARIS = {"location": "Paris", "days": 3}
DSML = "｜DSML｜"
MM = "]<]minimax[>["
R1 = ("<｜tool▁calls▁begin｜>", "<｜tool▁call▁begin｜>", "<｜tool▁sep｜>", "<｜tool▁call▁end｜>",
      "<｜tool▁calls▁end｜>")
P = '{"location": "Paris", "days": 3}'
NAMED = '{"name": "get_weather", "arguments": ' + P + "}"
CALLS = {
    "mistral_args": ("[TOOL_CALLS]get_weather[ARGS]" + P, ""),
    "glm": ("<tool_call>get_weather\n<arg_key>location</arg_key>\n<arg_value>Paris</arg_value>\n"
            "<arg_key>days</arg_key>\n<arg_value>3</arg_value>\n</tool_call>", ""),
    "kimi_k2": ("<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0"
                f"<|tool_call_argument_begin|>{P}<|tool_call_end|><|tool_calls_section_end|>",
                "functions.get_weather:0"),
    "minimax_m2": ('<minimax:tool_call>\n<invoke name="get_weather">\n<parameter name="location">'
                   'Paris</parameter>\n<parameter name="days">3</parameter>\n</invoke>\n'
                   "</minimax:tool_call>", ""),
    "seed_oss": ("<seed:tool_call>\n<function=get_weather>\n<parameter=location>Paris</parameter>"
                 "\n<parameter=days>3</parameter>\n</function>\n</seed:tool_call>", ""),
    "functionary_v3_1": (f"<function=get_weather>{P}</function>", ""),
    "functionary_v3_2": ("get_weather\n" + P, ""),
    "apriel": (f"<tool_calls>[{NAMED}]</tool_calls>", ""),
    "nemotron_v2": (f"<TOOLCALL>[{NAMED}]</TOOLCALL>", ""),
    "command_r7b": ('<|START_ACTION|>[{"tool_call_id": "0", "tool_name": "get_weather", '
                    f'"parameters": {P}}}]<|END_ACTION|>', "0"),
    "deepseek_v3_1": (f"{R1[0]}{R1[1]}get_weather{R1[2]}{P}{R1[3]}{R1[4]}", ""),
    "apertus": ('<|tools_prefix|>[{"get_weather": ' + P + "}]<|tools_suffix|>", ""),
    "gigachat3": ("<|message_sep|>\n\nfunction call<|role_sep|>\n" + NAMED, ""),
    "gigachat3_1": ("<|function_call|>" + NAMED, ""),
    "minimax_m1": (f"<tool_calls>\n{NAMED}\n</tool_calls>", ""),
    "solar_open": ("<|tool_calls|><|tool_call:begin|>call00001<|tool_call:name|>get_weather"
                   f"<|tool_call:args|>{P}<|tool_call:end|>", "call00001"),
    "minicpm5": ('<function name="get_weather"><param name="location">Paris</param>'
                 '<param name="days">3</param></function>', ""),
    "hunyuan": ("<tool_calls:opensource>\n<tool_call:opensource>get_weather<tool_sep:opensource>"
                "\n<arg_key:opensource>location</arg_key:opensource>\n<arg_value:opensource>Paris"
                "</arg_value:opensource>\n<arg_key:opensource>days</arg_key:opensource>\n"
                "<arg_value:opensource>3</arg_value:opensource>\n</tool_call:opensource>\n"
                "</tool_calls:opensource>", ""),
    "deepseek_dsml": (f'<{DSML}function_calls>\n<{DSML}invoke name="get_weather">\n'
                      f'<{DSML}parameter name="location" string="true">Paris</{DSML}parameter>\n'
                      f'<{DSML}parameter name="days" string="false">3</{DSML}parameter>\n'
                      f"</{DSML}invoke>\n</{DSML}function_calls>", ""),
    "minimax_m3": (f'{MM}<tool_call>\n{MM}<invoke name="get_weather">{MM}<location>Paris'
                   f"{MM}</location>{MM}<days>3{MM}</days>{MM}</invoke>\n{MM}</tool_call>", ""),
    "gemma4": ('<|tool_call>call:get_weather{days:3,location:<|"|>Paris<|"|>}<tool_call|>', ""),
    "lfm2": ("<|tool_call_start|>[get_weather(location='Paris', days=3)]<|tool_call_end|>", ""),
}


def syntax(fmt: str) -> ChatSyntax:
    return ChatSyntax(format=fmt, tools=TOOLS, parse_tools=True)


def test_every_new_format_has_a_case():
    assert set(CALLS) == set(FAMILIES) | set(TAGGED) | {"functionary_v3_2"}


@pytest.mark.parametrize("fmt", sorted(CALLS))
def test_the_call_parses_to_the_call(fmt):
    text, call_id = CALLS[fmt]
    message = parse("Let me look. " + text if fmt != "functionary_v3_2" else text,
                    syntax(fmt), False)
    assert [(c.name, json.loads(c.arguments)) for c in message.tool_calls] == \
        [("get_weather", PARIS)]
    assert message.tool_calls[0].id == call_id
    if fmt != "functionary_v3_2":
        assert message.content == "Let me look. "


@pytest.mark.parametrize("fmt", sorted(CALLS))
def test_reparsed_after_every_character_it_only_grows(fmt):
    text = CALLS[fmt][0]
    before = parse("", syntax(fmt), True)
    for end in range(1, len(text) + 1):
        now = parse(text[:end], syntax(fmt), True)
        assert now.content.startswith(before.content)
        assert len(now.tool_calls) >= len(before.tool_calls)
        for old, new in zip(before.tool_calls, now.tool_calls):
            assert new.name == old.name and new.arguments.startswith(old.arguments), text[:end]
        before = now
    assert json.loads(before.tool_calls[0].arguments) == PARIS


@pytest.mark.parametrize("fmt", sorted(CALLS))
def test_an_undeclared_tool_fails_the_parse(fmt):
    text = CALLS[fmt][0].replace("get_weather", "rm_rf")
    with pytest.raises(ParseFailure):
        parse(text, syntax(fmt), False)


@pytest.fixture(scope="module")
def lltokenizer():
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(MODEL)
    return tokenizer, llguidance.hf.from_tokenizer(tokenizer, n_vocab=len(tokenizer))


@pytest.mark.parametrize("fmt", sorted(f for f in CALLS if has_grammar(f)))
def test_the_grammar_takes_the_call_and_refuses_another_tool(fmt, lltokenizer):
    tokenizer, ll = lltokenizer
    text = CALLS[fmt][0]
    made = tool_constraint(syntax(fmt), list(TOOLS), False, True, lambda _: None)
    matcher = llguidance.LLMatcher(ll, llguidance.LLMatcher.grammar_from_lark(made.grammar))
    assert not matcher.get_error()
    assert matcher.consume_tokens(tokenizer.encode(text, add_special_tokens=False))
    assert matcher.is_accepting()
    other = llguidance.LLMatcher(ll, llguidance.LLMatcher.grammar_from_lark(made.grammar))
    wrong = text.replace("get_weather", "rm_rf")
    assert not other.consume_tokens(tokenizer.encode(wrong, add_special_tokens=False))
    lazy = tool_constraint(syntax(fmt), list(TOOLS), True, True, lambda _: None)
    assert lazy.lazy and [t["value"] for t in lazy.triggers] == \
        list({**FAMILIES, **TAGGED}[fmt][0])
    assert any(text.startswith(t["value"]) for t in lazy.triggers)


def test_the_formats_without_a_grammar_yet_are_the_listed_ones():
    assert sorted(f for f in CALLS if not has_grammar(f)) == \
        ["deepseek_dsml", "functionary_v3_2", "gemma4", "lfm2", "minimax_m3"]


FIXTURE_FORMATS = {"deepseek_r1": "deepseek_r1", "functionary_v3_2": "functionary_v3_2",
                   "gemma4": "gemma4", "glm": "glm", "gpt_oss": "gpt_oss",
                   "hermes_think": "hermes", "kimi_k2": "kimi_k2", "lfm2": "lfm2",
                   "llama3": "llama3", "minimax_m2": "minimax_m2", "mistral": "mistral",
                   "mistral_args": "mistral_args", "qwen35_xml": "qwen3_coder"}


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(MODEL)


def test_every_fixture_template_is_detected_and_its_call_parses_back(tokenizer):
    checks = {c.name: c for c in check_folder(TEMPLATES, tokenizer)}
    assert {name: c.format for name, c in checks.items()} == FIXTURE_FORMATS
    for c in checks.values():
        assert c.renders_calls and c.round_trip, (c.name, c.verdict, c.call_text)
        assert "sunny" in c.conversation  # the call's result and the answer render too
    assert checks["kimi_k2"].call_text.startswith("<|tool_calls_section_begin|>")


@pytest.mark.parametrize(("name", "objects"), [
    ("glm", True),  # .items()
    ("minimax_m2", True),  # | items
    ("gemma4", True),  # walks the object with its own syntax
    ("hermes_think", True),  # | tojson
    ("mistral", True),  # tojson over the whole call
    ("functionary_v3_2", False),  # prints the JSON string
])
def test_the_arguments_are_given_as_the_template_reads_them(name, objects, tokenizer):
    template = ChatTemplate(tokenizer, (TEMPLATES / f"{name}.jinja").read_text())
    assert template.object_arguments is objects


def test_a_template_may_change_its_lists_and_tojson_a_generator(tokenizer):
    source = ("{%- set names = [] %}{%- for m in messages %}{%- set _ = names.append(m.role) %}"
              "{%- endfor %}{{ names | tojson }} {{ messages | map(attribute='content') "
              "| tojson }} {{ names.pop() }}")
    rendered = ChatTemplate(tokenizer, source).render(
        [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}], False)
    assert rendered == '["user", "assistant"] ["a", "b"] assistant'
    assert detect_format(source) == "content"


@pytest.mark.parametrize(("source", "tags"), [
    ("{{ '<seed:think>' }}{{ '</seed:think>' }}", ("<seed:think>", "</seed:think>")),
    ("{%- set t = '<think{}>'.format(':opensource') %}<think>", ("<think:opensource>",
                                                                "</think:opensource>")),
    ("[THINK]{{ x }}[/THINK]", ("[THINK]", "[/THINK]")),
    ("<|START_THINKING|>", ("<|START_THINKING|>", "<|END_THINKING|>")),
    ("{{ '<|channel>thought\\n' }}", ("<|channel>thought", "<channel|>")),
    ("<mm:think><think>", ("<mm:think>", "</mm:think>")),
    ("<think>", ("<think>", "</think>")),
    ("no reasoning", None),
])
def test_the_templates_reasoning_tags(source, tags):
    assert detect_think_tags(source) == tags


def test_the_reasoning_is_split_at_the_templates_own_tags():
    text = "<seed:think>Paris, surely.</seed:think>" + CALLS["seed_oss"][0]
    message = parse(text, ChatSyntax(format="seed_oss", tools=TOOLS, parse_tools=True,
                                     reasoning=True, thinks=True, think_start="<seed:think>",
                                     think_end="</seed:think>"), False)
    assert message.reasoning_content == "Paris, surely."
    assert [c.name for c in message.tool_calls] == ["get_weather"]
    made = tool_constraint(ChatSyntax(format="seed_oss", tools=TOOLS, parse_tools=True,
                                      reasoning=True, thinks=True, in_reasoning=True,
                                      think_start="<seed:think>", think_end="</seed:think>"),
                           list(TOOLS), False, True, lambda _: None)
    assert "<seed:think>" in made.preserved and "<\\/seed:think>" in made.grammar
