"""The thread an engine owns and its inbox: the MLX engine and the fake one share this plumbing.

A subclass sets ``THREAD_NAME``, ``error``, ``_waiting`` (admission units), ``_cancel(group_id)``
and ``_run()``, and calls ``_init_thread()`` in its constructor.
"""

from __future__ import annotations

import atexit
import logging
import queue
import threading
import weakref
from collections.abc import Callable
from typing import Any

from .control import reasoning_end
from .tasks import units
from .types import EngineError

log = logging.getLogger("mlxray.engine")

# engines still running when the interpreter exits: stopped first, because a thread that ends
# after the interpreter began finalizing runs MLX's thread-local destructors, which take the GIL,
# and the process aborts (std::terminate) instead of exiting
_running: weakref.WeakSet = weakref.WeakSet()


@atexit.register
def _stop_running() -> None:
    for engine in list(_running):
        engine.stop()


class EngineThread:
    THREAD_NAME = "mlxray-engine"
    error: BaseException | None

    def _init_thread(self) -> None:
        self._inbox: queue.Queue = queue.Queue()
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name=self.THREAD_NAME, daemon=True)
        self._thread.start()
        _running.add(self)

    def stop(self, timeout: float = 5.0) -> None:
        _running.discard(self)
        self._stopping.set()
        self._inbox.put(None)
        if self._thread is not None:
            self._thread.join(timeout)
            if self._thread.is_alive():
                log.warning("the engine loop did not stop within %.0f s", timeout)

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive() and self.error is None

    def cancel(self, group_id: int) -> None:
        self._inbox.put(("cancel", group_id))

    def control(self, completion_id: str) -> dict:
        """End the reasoning of the running sequence ``completion_id`` names (engine/control.py),
        between two steps."""
        return self.run_on_loop(lambda eng: reasoning_end(
            [s.task for s in eng.slots if s.task is not None], completion_id))

    def run_on_loop(self, fn: Callable[[Any], object], timeout: float = 60.0) -> object:
        """Run ``fn(engine)`` on the engine's thread (it owns every MLX array); wait for it."""
        if not self.alive:
            raise EngineError("the engine is not running", 503, "unavailable_error")
        done = threading.Event()
        box: dict[str, object] = {}

        def call() -> None:
            try:
                box["value"] = fn(self)
            except BaseException as exc:  # handed back to the caller's thread
                box["error"] = exc
            finally:
                done.set()

        self._inbox.put(("call", call))
        if not done.wait(timeout):
            raise EngineError("the engine did not answer in time", 503, "unavailable_error")
        if "error" in box:
            raise box["error"]  # type: ignore[misc]
        return box.get("value")

    def inject_fault(self, exc: BaseException) -> None:
        """Fault injection: the engine's thread raises ``exc`` between steps, so the loop dies
        as it would on a crash (the fault tests use it; nothing routes it to HTTP)."""
        self._inbox.put(("raise", exc))

    def _drain_inbox(self, block: bool) -> None:
        try:
            item = self._inbox.get(timeout=0.5) if block else self._inbox.get_nowait()
        except queue.Empty:
            return
        while item is not None:
            self._apply(*item)
            try:
                item = self._inbox.get_nowait()
            except queue.Empty:
                item = None

    def _apply(self, kind: str, value: Any) -> None:
        """One inbox item, on the engine's thread (engine/lockstep.py forwards some to ranks)."""
        if kind == "submit":
            self._waiting.extend(units(value.tasks))
        elif kind == "cancel":
            self._cancel(value)
        elif kind == "call":
            value()
        elif kind == "raise":
            raise value
