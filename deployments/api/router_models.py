"""llama-server's router mode as data: each model's status, the least recently used idle model to
unload, the error texts and the ``GET /models/sse`` frames (tools/server/server-models.cpp)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from deployments.api.errors import ApiError, invalid

RUNNING = ("loading", "loaded", "sleeping")  # the reference's is_running
READY = ("loaded", "sleeping")  # is_ready_or_sleep


@dataclass
class ModelState:
    """One model of the folder, as the router sees it."""

    name: str
    status: str = "unloaded"
    last_used: float = 0.0
    requests: int = 0  # requests being answered: a busy model is never the one unloaded
    exit_code: int = 0
    failed: bool = False
    info: dict[str, Any] = field(default_factory=dict)  # the loaded model's figures

    @property
    def running(self) -> bool:
        return self.status in RUNNING

    def status_json(self) -> dict[str, Any]:
        """/models' ``status``: value and args, and exit_code and failed after a failed load."""
        status: dict[str, Any] = {"value": self.status, "args": []}
        if self.failed:
            status |= {"exit_code": self.exit_code, "failed": True}
        return status


def has_capacity(states: list[ModelState], models_max: int) -> bool:
    return models_max <= 0 or sum(s.running for s in states) < models_max


def pick_victim(states: list[ModelState], exclude: str) -> str | None:
    """The least recently used model that is loaded (or asleep) and answering nothing."""
    idle = [s for s in states if s.name != exclude and s.status in READY and not s.requests]
    return min(idle, key=lambda s: s.last_used).name if idle else None


def wants_autoload(query_value: str | None, models_autoload: bool) -> bool:
    """A request's ``?autoload=``: true or 1 loads, any other value does not; none: the flag."""
    if not query_value:
        return models_autoload
    return query_value in ("true", "1")


def missing_model() -> ApiError:
    return invalid("model name is missing from the request")


def unknown_model(name: str) -> ApiError:
    return invalid(f"model '{name}' not found")


def not_loaded() -> ApiError:
    return invalid("model is not loaded")


def load_failed(name: str) -> ApiError:
    return ApiError(f"model name={name} failed to load", "server_error")


def event(model: str, name: str, data: dict[str, Any] | None = None) -> dict[str, Any]:
    """One SSE event: the model, the event's name and its data (none for some events)."""
    out: dict[str, Any] = {"model": model, "event": name}
    if data is not None:
        out["data"] = data
    return out


def status_change(state: ModelState) -> dict[str, Any]:
    """The reference's ``status_change`` event: the status, the exit code once unloaded, and
    the model's figures once loaded."""
    data: dict[str, Any] = {"status": state.status}
    if state.status == "unloaded":
        data["exit_code"] = state.exit_code
    if state.status == "loaded" and state.info:
        data["info"] = state.info
    return event(state.name, "status_change", data)


def sse_frame(item: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(item, separators=(",", ":")).encode() + b"\n\n"
