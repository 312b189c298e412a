"""``python -m compat.templates DIR [--markdown] [--show NAME]``: what mlxray makes of each chat
template in DIR (``*.jinja``, e.g. the llama.cpp snapshot's ``models/templates``).

Per template: the tool-call format detected, whether the template renders an assistant tool
call at all, and whether that call, written as the template writes it (the conversation
rendered with the call, less the prompt with its generation prompt and less the end of turn),
parses back to the same call on mlxray's chat path (``deployments/api/tools``); then the words
that arm ``tool_choice: "auto"``'s grammar. ``--show NAME`` prints one template's rendered
conversation (a call and its result) and the call's text. The table in docs/tools.md is this
command's ``--markdown`` output over the snapshot's templates.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from deployments.api.chat_template import ChatTemplate
from deployments.api.tools.grammars import tool_constraint
from deployments.api.tools.parsers import parse
from deployments.api.tools.request import chat_syntax, generation_prompt, read_tools
from deployments.api.tools.syntax import CONTENT, ChatSyntax, ParseFailure
from deployments.api.tools.template_messages import template_message

TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "required": ["location"], "properties": {
        "location": {"type": "string"}, "days": {"type": "integer"}}}}}]
ARGUMENTS = {"location": "Paris", "days": 3}
CALL = {"type": "function", "id": "call00001",
        "function": {"name": "get_weather", "arguments": json.dumps(ARGUMENTS)}}
USER = {"role": "user", "content": "What is the weather in Paris?"}
RESULT = {"role": "tool", "tool_call_id": "call00001", "name": "get_weather",
          "content": '{"sky": "sunny"}'}
ANSWER = {"role": "assistant", "content": "It is sunny in Paris."}
END_PROBE = "mlxray-end-of-turn-probe"
EXTRA = {"enable_thinking": False}
# end-of-generation tokens a turn with a call ends with where a plain answer ends otherwise
END_OF_TURN = ("<|eom_id|>", "<|eot_id|>", "<|END_OF_TURN_TOKEN|>", "<｜end▁of▁sentence｜>",
               "<|im_end|>", "</s>", "<|tool_response>", "<｜hy_eos:opensource｜>")


@dataclass
class TemplateCheck:
    name: str
    format: str
    renders_calls: bool = False
    call_text: str = ""  # the call as the template writes it, as the model would generate it
    round_trip: bool = False
    triggers: tuple[str, ...] = ()
    reasoning: tuple[str, ...] = ()  # the reasoning tags the template renders
    error: str = ""
    conversation: str = ""

    @property
    def verdict(self) -> str:
        if self.error:
            return "render error"
        if not self.renders_calls:
            return "no tool calls in the template"
        return "parses back" if self.round_trip else "does not parse back"


def check(name: str, source: str, tokenizer: Any) -> TemplateCheck:
    template = ChatTemplate(tokenizer, source)
    tools = read_tools({"tools": TOOLS})
    out = TemplateCheck(name, template.format, reasoning=template.think_tags or ())
    messages = [template_message(USER, template.object_arguments)]
    call = template_message({"role": "assistant", "content": "", "tool_calls": [CALL]},
                            template.object_arguments)
    try:
        prompt = template.render(messages, True, EXTRA, tools.tools)
        with_call = template.render(messages + [call], False, EXTRA, tools.tools)
        ended = template.render(messages + [{"role": "assistant", "content": END_PROBE}],
                                False, EXTRA, tools.tools)
    except Exception as exc:  # noqa: BLE001 - the table reports what the template refuses
        out.error = str(getattr(exc, "message", exc)).splitlines()[0][:120]
        return out
    try:
        out.conversation = template.render(
            messages + [call, template_message(RESULT, False), ANSWER], False, EXTRA,
            tools.tools)
    except Exception as exc:  # noqa: BLE001 - e.g. a template without a tool role
        out.conversation = f"(refused: {exc})"
    tail = generation_prompt(template.render, messages, EXTRA, tools.tools)
    syntax = chat_syntax(template, tools, "auto", False, tail)
    out.call_text = _generated(prompt, with_call, ended, syntax)
    out.renders_calls = "Paris" in out.call_text
    out.round_trip = out.renders_calls and _parses_back(out.call_text, syntax)
    if syntax.format != CONTENT:
        made = tool_constraint(syntax, tools.declared, True, True, lambda _: None)
        out.triggers = tuple(t["value"] for t in made.triggers) if made.grammar else ()
    return out


def _generated(prompt: str, with_call: str, ended: str, syntax: ChatSyntax) -> str:
    """What the model writes for the rendered call: the call's turn past the prompt with its
    generation prompt, or, where the template renders the earlier turns otherwise then, past
    what it shares with a plain answer's turn (cut back to a marker's start); less the end of
    turn."""
    if with_call.startswith(prompt):
        common = len(prompt)
    else:
        common = 0
        for a, b in zip(with_call, ended):
            if a != b:
                break
            common += 1
        while common and with_call[common - 1] not in "\n>]":
            common -= 1
    text = with_call[common:]
    end = ended[ended.rfind(END_PROBE) + len(END_PROBE):]
    if end.strip() and text.endswith(end):
        text = text[:-len(end)]
    elif end.strip() and end.strip() in text:
        text = text[:text.rfind(end.strip())]
    for marker in END_OF_TURN:
        if marker in text:
            text = text[:text.index(marker)]
    if syntax.in_reasoning and syntax.think_end not in text:
        text = f"Thinking.{syntax.think_end}\n\n{text}"
    return text


def _parses_back(text: str, syntax: ChatSyntax) -> bool:
    try:
        message = parse(text, syntax, False)
    except ParseFailure:
        return False
    calls = [(c.name, _loads(c.arguments)) for c in message.tool_calls]
    return calls == [("get_weather", ARGUMENTS)]


def _loads(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return text


def check_folder(folder: Path, tokenizer: Any) -> list[TemplateCheck]:
    return [check(path.stem, path.read_text(), tokenizer)
            for path in sorted(folder.glob("*.jinja"))]


def markdown(checks: list[TemplateCheck]) -> str:
    lines = ["| template | format | tool call | `auto` grammar armed at | reasoning |",
             "|---|---|---|---|---|"]
    for c in checks:
        armed = ", ".join(f"`{json.dumps(t, ensure_ascii=False)[1:-1]}`"
                          for t in c.triggers).replace("|", "\\|") or "-"
        tags = " … ".join(f"`{t}`" for t in c.reasoning).replace("|", "\\|") or "-"
        lines.append(f"| {c.name} | {c.format} | {c.verdict} | {armed} | {tags} |")
    passed = sum(c.round_trip for c in checks)
    calls = sum(c.renders_calls for c in checks)
    lines.append("")
    lines.append(f"{len(checks)} templates; {calls} render a tool call; {passed} of those "
                 "parse back to the same call.")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m compat.templates", description=__doc__)
    parser.add_argument("folder", type=Path, help="a folder of *.jinja chat templates")
    parser.add_argument("--tokenizer", default="models/tiny-python",
                        help="whose special tokens (bos_token, eos_token) the templates see")
    parser.add_argument("--markdown", action="store_true", help="print the table as Markdown")
    parser.add_argument("--show", metavar="NAME", help="print one template's renders")
    args = parser.parse_args(argv)
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(args.tokenizer)
    if args.show:
        c = check(args.show, (args.folder / f"{args.show}.jinja").read_text(), tokenizer)
        print(f"format: {c.format}\n{c.verdict}\n--- conversation ---\n{c.conversation}\n"
              f"--- the call as generated ---\n{c.call_text}")
        return 0
    checks = check_folder(args.folder, tokenizer)
    if args.markdown:
        print(markdown(checks))
    else:
        for c in checks:
            print(f"{c.name:48s} {c.format:12s} {c.verdict}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
