"""A reference answer as the captures hold it: status, content type without its parameters, and
the JSON body, or each SSE ``data:`` payload (a payload that is not JSON, such as ``[DONE]``, as
``{"__raw__": ...}``), or the raw text; ``../shared/reference/compare.py`` reads answers alike.
compat/record.py writes captures with it, tests/captures.py compares answers with it."""

from __future__ import annotations

import json
from typing import Any


def parse_answer(status: int, ctype: str, raw: bytes) -> dict:
    out: dict[str, Any] = {"status": status, "content_type": ctype.split(";")[0].strip()}
    text = raw.decode("utf-8", errors="replace")
    if out["content_type"] == "text/event-stream":
        events = []
        for line in text.splitlines():
            if line.startswith("data: "):
                try:
                    events.append(json.loads(line[6:]))
                except json.JSONDecodeError:
                    events.append({"__raw__": line[6:]})
        out["events"] = events
        return out
    try:
        out["body"] = json.loads(text)
    except json.JSONDecodeError:
        out["text"] = text
    return out
