"""Where the engine computes: a stream of its own on the device the model was loaded for, and
MLX's wired-memory limit (Metal), raised once while the engine runs and restored when it stops.

mlx-lm's ``generation_stream`` is made when ``mlx_lm.generate`` is imported, on whatever device
was the default then, and each ``BatchGenerator`` raises the wired limit when it is made and puts
the previous one back when it is closed or collected: the engine makes a new generator after a
failed step, and the old one's restore would undo the limit while the new one runs.
"""

from __future__ import annotations

import mlx.core as mx
from mlx_lm.utils import maybe_set_recommended_wired_limit


def engine_stream(device: mx.Device) -> mx.Stream:
    """A stream on ``device``, made on the thread that uses it (the scheduler's)."""
    return mx.new_stream(device)


def release_streams(stream: mx.Stream | None) -> None:
    """Finish the loop thread's work and free its streams on that thread, before it exits.

    Left to the thread's exit, MLX frees them in C++ thread-local destructors that run after
    Python's ``join`` has returned: an interpreter exiting meanwhile tears down MLX's scheduler
    under them, and the process aborts ("terminate called without an active exception", seen
    once in CI at the end of an engine-only bench). ``mx.clear_streams`` is MLX's API for this.
    """
    try:
        if stream is not None:
            mx.synchronize(stream)
    finally:
        mx.clear_streams()


class WiredLimit:
    """The recommended wired limit for as long as the engine runs (a no-op where MLX reports no
    recommended working set, as on CPUs)."""

    def __init__(self) -> None:
        self._previous: int | None = None

    def raise_(self) -> None:
        self._previous = maybe_set_recommended_wired_limit()

    def restore(self, stream: mx.Stream | None) -> None:
        if self._previous is None:
            return
        if stream is not None:
            mx.synchronize(stream)
        mx.set_wired_limit(self._previous)
        self._previous = None
