"""The model's own chat template (the tokenizer's Jinja ``chat_template``, or a template file
named in the config, as llama-server's ``--chat-template-file``), rendered as the reference
renders it with ``--jinja``; ChatML when the model has none, as llama.cpp falls back."""

from __future__ import annotations

import re
from typing import Any

from deployments.api.errors import invalid
from deployments.api.tools.syntax import detect_format

CHATML = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content']"
    " + '<|im_end|>\\n' }}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


# A template that reads a tool call's arguments as an object (tojson, items()) gets objects.
_OBJECT_ARGUMENTS = re.compile(r"arguments['\"]?\]?\s*(\|\s*tojson|\|\s*items|\.items\(\))")


class ChatTemplate:
    def __init__(self, hf_tokenizer: Any, source: str | None = None,
                 kwargs: dict[str, Any] | None = None):
        self.hf = hf_tokenizer
        self.kwargs = dict(kwargs or {})  # the server's chat_template_kwargs, under a request's
        self.source: str = source or getattr(hf_tokenizer, "chat_template", None) or CHATML
        self.format = detect_format(self.source)  # its tool-call format (deployments/api/tools)
        self.thinks = "<think>" in self.source  # it renders <think> reasoning
        self.object_arguments = bool(_OBJECT_ARGUMENTS.search(self.source))

    def render(self, messages: list[dict], add_generation_prompt: bool = True,
               extra: dict | None = None, tools: list[dict] | None = None) -> str:
        try:
            return self.hf.apply_chat_template(
                messages, chat_template=self.source, tokenize=False, tools=tools or None,
                add_generation_prompt=add_generation_prompt, **(extra or {}),
            )
        except Exception as exc:  # noqa: BLE001 - a template that refuses the conversation
            raise invalid(f"Failed to apply the chat template: {exc}") from None

    def caps(self) -> dict:
        """chat_template_caps, found by rendering probes as llama.cpp's minja does."""
        probe = "mlxray-probe-text"
        return {
            "supports_object_arguments": self.object_arguments,
            "supports_parallel_tool_calls": "tool_calls" in self.source,
            "supports_preserve_reasoning": "reasoning_content" in self.source,
            "supports_reasoning_effort": "reasoning_effort" in self.source,
            "supports_string_content": self._shows([{"role": "user", "content": probe}], probe),
            "supports_system_role": self._shows(
                [{"role": "system", "content": probe}, {"role": "user", "content": "x"}], probe),
            "supports_tool_calls": "tool_calls" in self.source,
            "supports_tools": "tools" in self.source,
            "supports_typed_content": False,
        }

    def _shows(self, messages: list[dict], needle: str) -> bool:
        try:
            return needle in self.render(messages, False)
        except Exception:  # noqa: BLE001 - a template that raises does not support the probe
            return False
