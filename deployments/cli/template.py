"""llama-server's chat template options: ``--chat-template`` (with Jinja always on, as mlxray
renders, only the name ``chatml`` is a name: any other value is the template's text),
``--chat-template-file`` (the last of the two given wins, as in the reference) and
``--chat-template-kwargs`` (default template variables)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from deployments.cli.runtime import last_of


def _json_object(text: str) -> str | None:
    try:
        value = json.loads(text)
    except ValueError as exc:
        return f"invalid JSON: {exc}"
    return None if isinstance(value, dict) else "must be a JSON object"


def options(option: type) -> tuple:
    """The three options, as ``option`` (the command's Option class) describes them."""
    return (
        option(("--chat-template",), "chat_template", "LLAMA_ARG_CHAT_TEMPLATE",
               help="a Jinja chat template's text instead of the model's own (the name chatml: "
                    "ChatML; templates are always Jinja, so any other value is template text)"),
        option(("--chat-template-file",), "chat_template_file", "LLAMA_ARG_CHAT_TEMPLATE_FILE",
               help="a Jinja chat template file instead of the model's own"),
        option(("--chat-template-kwargs",), "chat_template_kwargs",
               "LLAMA_ARG_CHAT_TEMPLATE_KWARGS", help="default template variables, a JSON object "
               "(a request's chat_template_kwargs override them key by key)",
               check=_json_object),
    )


def template_fields(ns: Any) -> dict[str, Any]:
    """--chat-template (text, or the name chatml) or --chat-template-file, the last given
    winning as in the reference (the file read at start), and --chat-template-kwargs."""
    fields: dict[str, Any] = {}
    last = last_of(ns.argv, ("--chat-template", "--chat-template-file"))
    if last is None:  # from the environment: a file's variable wins, as it is parsed later
        last = "--chat-template-file" if ns.chat_template_file else "--chat-template"
    if last == "--chat-template-file" and ns.chat_template_file:
        path = Path(ns.chat_template_file).resolve()
        if not path.is_file():
            raise ValueError(f"--chat-template-file: failed to open file '{ns.chat_template_file}'")
        fields["chat_template_file"] = str(path)
    elif ns.chat_template is not None:
        fields["chat_template"] = ns.chat_template
    if ns.chat_template_kwargs:
        fields["chat_template_kwargs"] = json.loads(ns.chat_template_kwargs)
    return fields
