"""The engine seam: what the model replica (deployments/serve/replica.py) drives, whatever runs
the model. ``engine.scheduler.Engine`` (MLX, mlx-lm's BatchGenerator) is one implementation;
``engine.fake.FakeEngine`` (deterministic tokens, no model, no MLX) is the other, for the tests
of routes, validation, envelopes, shaping and framing, where a model adds nothing. A replica
is given its engine's maker as Ray Serve LLM's ``LLMServer`` is given ``engine_cls``.

Requests go in through ``submit`` (a group: one client request's prompts times n_cmpl) and come
back as events through the group's sink, called from the engine's own thread
(``engine/aio.py`` turns it into an async iterator); ``cancel`` ends a group; the slots and the
prompt cache are seen through ``slot_states`` and ``metrics_snapshot``, and changed on the
engine's thread through ``run_on_loop`` (engine/slot_store.py).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from .types import EngineConfig, EngineEvent, GenerationRequest
from .vocab import Vocab

Sink = Callable[[list[EngineEvent]], None]


class ModelFacts(Protocol):
    """The loaded model's figures that /props and /v1/models report."""

    path: str
    n_ctx_train: int
    n_embd: int
    n_params: int
    size_bytes: int
    chat_template: str | None
    ftype: str


class AdapterTable(Protocol):
    """The LoRA adapters an engine holds (engine/lora.py's AdapterSet)."""

    loaded: dict[str, Any]

    def check(self, adapters: tuple[tuple[str, float], ...]) -> str | None: ...


class EngineLike(Protocol):
    """The engine as the replica drives it; every method is thread-safe unless it says not."""

    loaded: ModelFacts
    vocab: Vocab
    config: EngineConfig
    adapters: AdapterTable
    error: BaseException | None

    def start(self) -> None: ...

    def stop(self, timeout: float = 5.0) -> None: ...

    @property
    def alive(self) -> bool: ...

    def validate(self, req: GenerationRequest) -> None:
        """Raise EngineError for what submit would refuse (compiles a grammar once)."""

    def submit(self, requests: list[GenerationRequest], sink: Sink) -> int:
        """Queue one group; its events go to ``sink``; returns the id ``cancel`` takes."""

    def cancel(self, group_id: int) -> None: ...

    @property
    def n_active(self) -> int:
        """Slots running a sequence now."""

    @property
    def n_deferred(self) -> int:
        """Requests waiting for a slot."""

    def slot_states(self) -> list[dict]: ...

    def metrics_snapshot(self, reset_bucket: bool = True) -> dict: ...

    def control(self, completion_id: str) -> dict:
        """``reasoning_end`` for the running sequence of ``completion_id``: the control route's
        answer (engine/control.py)."""

    def run_on_loop(self, fn: Callable[[Any], object], timeout: float = 60.0) -> object:
        """``fn(engine)`` on the engine's own thread; its value, or its exception raised."""

    def debug_state(self) -> dict: ...

    def inject_fault(self, exc: BaseException) -> None: ...
