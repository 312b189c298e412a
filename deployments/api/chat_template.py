"""The model's own chat template (the tokenizer's Jinja ``chat_template``, or a template file
named in the config, as llama-server's ``--chat-template-file``), rendered as the reference
renders it with ``--jinja``; ChatML when the model has none, as llama.cpp falls back."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from jinja2.sandbox import ImmutableSandboxedEnvironment, SandboxedEnvironment

from deployments.api.errors import invalid
from deployments.api.tools.syntax import detect_format, detect_think_tags

CHATML = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content']"
    " + '<|im_end|>\\n' }}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

PROBE_VALUE = "mlxray-probe-value"
_LIST_MUTATORS = ("append", "pop")  # the reference's Jinja lets a template change its lists


class ChatTemplate:
    def __init__(self, hf_tokenizer: Any, source: str | None = None,
                 kwargs: dict[str, Any] | None = None):
        self.hf = hf_tokenizer
        self.kwargs = dict(kwargs or {})  # the server's chat_template_kwargs, under a request's
        self.source: str = source or getattr(hf_tokenizer, "chat_template", None) or CHATML
        self.format = detect_format(self.source)  # its tool-call format (deployments/api/tools)
        self.think_tags = detect_think_tags(self.source)  # its reasoning tags, if any
        self.thinks = self.think_tags is not None
        self.object_arguments = self._reads_object_arguments()

    def render(self, messages: list[dict], add_generation_prompt: bool = True,
               extra: dict | None = None, tools: list[dict] | None = None) -> str:
        _like_the_reference(self.source)
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

    def _reads_object_arguments(self) -> bool:
        """Whether the template reads a tool call's arguments as an object, as the reference's
        capability probe finds it (the object's ``arg`` used): arguments given as a JSON string
        fail to render or come out JSON-encoded again (``tojson`` over the call or its
        arguments), or the object is rendered otherwise than its Python form."""
        def rendered(arguments: Any) -> str | None:
            call = {"id": "call00001", "type": "function",
                    "function": {"name": "tool1", "arguments": arguments}}
            messages = [{"role": "user", "content": "User message"},
                        {"role": "assistant", "content": "", "tool_calls": [call]}]
            try:
                return self.render(messages, False, tools=[PROBE_TOOL])
            except Exception:  # noqa: BLE001 - the probe's form is refused
                return None

        as_object = rendered({"arg": PROBE_VALUE})
        if as_object is None or PROBE_VALUE not in as_object:
            return False
        as_string = rendered(json.dumps({"arg": PROBE_VALUE}))
        if as_string is None or '\\"arg\\"' in as_string:
            return True
        # it walks the object (not printing its repr, not printing both forms alike)
        return repr({"arg": PROBE_VALUE}) not in as_object and as_object != as_string


PROBE_TOOL = {"type": "function", "function": {
    "name": "tool1", "description": "Tool description",
    "parameters": {"type": "object", "properties": {"arg": {"type": "string"}},
                   "required": ["arg"]}}}


def _like_the_reference(source: str) -> None:
    """transformers renders in an immutable sandbox; the reference's engine has ``append`` and
    ``pop`` on lists (Kimi K2's template needs them), and its filters give lists where Jinja's
    give generators (``tools | map(...) | tojson``), so the compiled template's environment
    (cached per source by transformers) allows those two and its ``tojson`` takes both."""
    try:  # transformers' private compile cache (the pin comment in pyproject.toml)
        from transformers.utils.chat_template_utils import _compile_jinja_template
    except ImportError:
        return
    env = _compile_jinja_template(source).environment
    if getattr(env, "mlxray_lists", False):
        return

    def is_safe_attribute(obj: Any, attr: str, value: Any) -> bool:
        if isinstance(obj, list) and attr in _LIST_MUTATORS:
            return SandboxedEnvironment.is_safe_attribute(env, obj, attr, value)
        return ImmutableSandboxedEnvironment.is_safe_attribute(env, obj, attr, value)

    tojson = env.filters["tojson"]

    def listed(value: Any) -> Any:
        if isinstance(value, Iterator):
            return [listed(v) for v in value]
        if isinstance(value, dict):
            return {k: listed(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [listed(v) for v in value]
        return value

    env.is_safe_attribute = is_safe_attribute
    env.filters["tojson"] = lambda value, *args, **kwargs: tojson(listed(value), *args, **kwargs)
    env.mlxray_lists = True
