"""The engine on the device the model was loaded for (its own stream there, not mlx-lm's
import-time ``generation_stream``), and MLX's wired-memory limit raised once for the engine's life:
kept across a failed step, restored when the engine stops. A CPU has neither a second device nor
a wired limit, so stand-ins play the GPU's device and Metal's limit."""

from __future__ import annotations

import mlx.core as mx
import pytest
from mlx_lm.generate import generation_stream

from engine import scheduler
from engine.model import load_model
from engine.scheduler import Engine, EngineConfig
from engine.types import FinalEvent, GenerationRequest, SamplingParams

from ..conftest import MODEL, run_engine, up


@pytest.fixture(scope="module")
def loaded():
    return load_model(MODEL)


def started(loaded) -> Engine:
    return up(Engine(loaded, EngineConfig(n_parallel=2, n_ctx=256, n_batch=16)))


def greedy(engine: Engine, n: int = 4) -> GenerationRequest:
    return GenerationRequest(engine.vocab.tokenize("import os\n", add_special=True),
                             SamplingParams(temperature=0.0), n_predict=n, cache_prompt=False)


def test_the_engine_decodes_on_its_own_stream_on_the_models_device(loaded):
    assert loaded.device == mx.default_device()  # what load_model chose (the CPU here)
    engine = started(loaded)
    try:
        [final] = [e for e in run_engine(engine, greedy(engine)) if isinstance(e, FinalEvent)]
        assert final.n_predicted == 4
        assert engine._bg.stream == engine._stream and engine._stream.device == loaded.device
        assert engine._bg.stream != generation_stream
    finally:
        engine.stop()


def test_the_stream_is_made_on_the_chosen_device_not_the_default(loaded, monkeypatch):
    """A model loaded for the GPU while the default device is the CPU (mlx-lm's
    generation_stream is on the default): the engine asks for a stream on the GPU."""
    asked: list[mx.Device] = []

    def stream_on(device: mx.Device) -> mx.Stream:
        asked.append(device)
        return mx.new_stream(mx.cpu)  # a device every machine has

    monkeypatch.setattr(scheduler, "engine_stream", stream_on)
    before = mx.default_device()
    mx.set_default_device(mx.cpu)  # on a GPU machine too: the premise is a CPU default
    gpu = mx.Device(mx.gpu)
    try:
        engine = Engine(loaded, EngineConfig(n_parallel=1, n_ctx=256, n_batch=16))
        engine.loaded = type(loaded)(**{**loaded.__dict__, "device": gpu})
        engine.start()
        try:
            run_engine(engine, greedy(engine, 1))
        finally:
            engine.stop()
        assert asked == [gpu] and gpu != mx.default_device()
    finally:
        mx.set_default_device(before)


class FakeMetal:
    """Metal's wired limit as mlx-lm sees it: a recommended working set, and set_wired_limit
    returning the limit it replaces."""

    def __init__(self, monkeypatch):
        self.limit, self.history = 0, []
        monkeypatch.setattr(mx, "device_info", lambda: {
            "max_recommended_working_set_size": 1 << 30})
        monkeypatch.setattr(mx, "set_wired_limit", self.set)

    def set(self, limit: int) -> int:
        previous, self.limit = self.limit, limit
        self.history.append(limit)
        return previous


def test_the_wired_limit_holds_across_a_failed_step_and_is_restored_at_stop(loaded, monkeypatch):
    metal = FakeMetal(monkeypatch)
    engine = started(loaded)
    try:
        run_engine(engine, greedy(engine))
        assert metal.limit == 1 << 30
        real_next, calls = engine._bg.next, []

        def failing_next():
            calls.append(1)
            if len(calls) == 2:
                raise RuntimeError("injected step failure")
            return real_next()

        engine._bg.next = failing_next
        failed = run_engine(engine, greedy(engine, 8))
        assert "injected step failure" in failed[-1].message  # that step's request failed
        import gc

        gc.collect()  # the replaced generator is gone: its close() ran
        [final] = [e for e in run_engine(engine, greedy(engine)) if isinstance(e, FinalEvent)]
        assert final.n_predicted == 4 and metal.limit == 1 << 30
    finally:
        engine.stop()
    assert metal.limit == 0 and metal.history[-1] == 0
    assert 0 not in metal.history[:-1]  # never dropped while the engine ran
