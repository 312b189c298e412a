"""How answers go on the wire: compact JSON as the reference writes it, SSE frames, and the
``Framing`` each response shape declares (deployments/shapes.py, deployments/protocols/)."""

from __future__ import annotations

import json
import math
from typing import Any


def dumps(obj: Any) -> bytes:
    """Compact JSON, UTF-8 unescaped, as the reference's dump_safe writes it; a non-finite float
    (a request's 1e400 echoed back) is written as null, as nlohmann::json writes it."""
    try:
        text = json.dumps(obj, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    except ValueError:
        text = json.dumps(_finite(obj), ensure_ascii=False, separators=(",", ":"),
                          allow_nan=False)
    return text.encode()


def _finite(obj: Any) -> Any:
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite(v) for v in obj]
    return obj


def sse(obj: Any) -> bytes:
    return b"data: " + dumps(obj) + b"\n\n"


class Framing:
    """How a shape's frames go on the wire: ``data:`` lines, an error as ``data: {"error"}``,
    what ends the stream, and how several non-stream results make one answer (native: a list)."""

    done = b""

    def encode(self, frame: dict) -> bytes:
        return sse(frame)

    def encode_error(self, envelope: dict) -> bytes:
        return sse(envelope)

    def merge(self, results: list[dict]) -> Any:
        return results
