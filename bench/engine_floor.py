"""The engine floor: mlx-lm's ``BatchGenerator`` and mlxray's ``Engine``, each driven directly in
this process on the same prompts, ``concurrency`` requests kept in flight (closed loop)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import mlx.core as mx
from mlx_lm.generate import BatchGenerator

from engine.model import LoadedModel
from engine.scheduler import Engine, EngineConfig
from engine.types import EngineEvent, ErrorEvent, FinalEvent, TokenEvent

from .ratios import RequestTiming
from .workload import Workload, engine_requests

Progress = Callable[[], None]


@dataclass
class _InFlight:
    t_submit: float
    t_first: float = 0.0
    t_last: float = 0.0
    n_tokens: int = 0

    def timing(self) -> RequestTiming:
        return RequestTiming(self.t_first - self.t_submit, self.t_last - self.t_submit,
                             self.n_tokens)


def run_mlx_lm(loaded: LoadedModel, work: Workload, concurrency: int, n_requests: int,
               n_parallel: int, n_batch: int, progress: Progress, sampler: Callable | None = None
               ) -> tuple[list[RequestTiming], float]:
    """mlx-lm's own continuous batching: greedy (or ``sampler``, one for the whole batch), no
    stop tokens, ``n_tokens`` each."""
    gen = BatchGenerator(loaded.model, max_tokens=work.n_tokens,
                         completion_batch_size=n_parallel, prefill_batch_size=n_parallel,
                         prefill_step_size=n_batch, sampler=sampler)
    bos = [loaded.vocab.bos_id] if loaded.vocab.add_bos else []
    inflight: dict[int, _InFlight] = {}
    done: list[RequestTiming] = []
    submitted = 0
    start = time.perf_counter()
    try:
        while len(done) < n_requests:
            while submitted < n_requests and len(inflight) < concurrency:
                uid = gen.insert([bos + work.prompts[submitted % len(work.prompts)]])[0]
                inflight[uid] = _InFlight(time.perf_counter())
                submitted += 1
            _, responses = gen.next()
            now = time.perf_counter()
            for r in responses:
                rec = inflight[r.uid]
                rec.n_tokens += 1
                if rec.n_tokens == 1:
                    rec.t_first = now
                rec.t_last = now
                if r.finish_reason is not None:
                    done.append(inflight.pop(r.uid).timing())
                    progress()
        wall = time.perf_counter() - start
    finally:
        gen.close()
    mx.clear_cache()
    return done, wall


def start_engine(loaded: LoadedModel, n_parallel: int, n_ctx: int, n_batch: int) -> Engine:
    engine = Engine(loaded, EngineConfig(n_parallel=n_parallel, n_ctx=n_ctx, n_batch=n_batch))
    engine.start()
    return engine


def run_engine(engine: Engine, work: Workload, concurrency: int, n_requests: int,
               progress: Progress) -> tuple[list[RequestTiming], float]:
    """mlxray's scheduler through its thread-safe API: each final event submits the next request
    (from the engine thread, like a consumer that answers at once)."""
    vocab = engine.vocab
    n_parallel = engine.config.n_parallel
    bodies = [work.body(i) for i in range(n_requests)]
    requests = [engine_requests(vocab, body, n_parallel) for body in bodies]
    done: list[RequestTiming] = []
    errors: list[str] = []
    finished = threading.Event()
    lock = threading.Lock()
    next_index = [0]

    def submit_next() -> None:
        with lock:
            i = next_index[0]
            if i >= n_requests:
                return
            next_index[0] += 1
        rec = _InFlight(time.perf_counter())
        engine.submit(requests[i], lambda events: on_events(rec, events))

    def on_events(rec: _InFlight, events: list[EngineEvent]) -> None:
        now = time.perf_counter()
        for ev in events:
            if isinstance(ev, TokenEvent):
                if rec.n_tokens == 0:
                    rec.t_first = now
                rec.n_tokens += 1
            elif isinstance(ev, FinalEvent):
                rec.t_last = now
                rec.n_tokens = ev.n_predicted
                done.append(rec.timing())
                progress()
                if len(done) == n_requests:
                    finished.set()
                else:
                    submit_next()
            elif isinstance(ev, ErrorEvent):
                errors.append(ev.message)
                finished.set()

    start = time.perf_counter()
    for _ in range(min(concurrency, n_requests)):
        submit_next()
    finished.wait()
    wall = time.perf_counter() - start
    if errors:
        raise RuntimeError(f"engine request failed: {errors[0]}")
    return done, wall
