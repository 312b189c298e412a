"""Probes for issue #36: the OpenAI routes' greedy answers compared exactly (they were compared by
shape only), streamed and not: ``/v1/chat/completions`` on the model's own template and
``/v1/completions``."""

from __future__ import annotations

CHAT = {"temperature": 0, "cache_prompt": False, "messages": [{"role": "user", "content": "hello"}],
        "max_tokens": 6}
COMPLETION = {"temperature": 0, "cache_prompt": False, "prompt": "def main():\n", "max_tokens": 6}


def _probe(name: str, path: str, body: dict) -> dict:
    return {"name": name, "method": "POST", "path": path, "mode": "exact", "public": True,
            "body": body}


PROBES = [
    _probe("oai_chat", "/v1/chat/completions", CHAT),
    _probe("oai_chat_stream", "/v1/chat/completions",
           {**CHAT, "stream": True, "stream_options": {"include_usage": True}}),
    _probe("oai_completions", "/v1/completions", COMPLETION),
    _probe("oai_completions_stream", "/v1/completions", {**COMPLETION, "stream": True}),
]
