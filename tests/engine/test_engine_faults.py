"""The engine alone under faults: cancellation lands within one decode step, a request that fails
inside the engine fails alone, the queue bound refuses with 503, a dead loop fails what it held."""

from __future__ import annotations

import asyncio
import time

import pytest

from engine import admission, aio
from engine.model import load_model
from engine.scheduler import Engine, EngineConfig
from engine.types import (
    EngineError,
    ErrorEvent,
    FinalEvent,
    GenerationRequest,
    SamplingParams,
    TokenEvent,
)

from ..conftest import MODEL


@pytest.fixture(scope="module")
def loaded():
    return load_model(MODEL)


@pytest.fixture()
def engine(loaded):
    eng = Engine(loaded, EngineConfig(n_parallel=2, n_ctx=512, n_batch=16, max_queue=2))
    eng.start()
    yield eng
    eng.stop()


def endless(engine: Engine, prompt: str = "def main():\n", **kw) -> GenerationRequest:
    """A greedy request that only the context limit ends (end-of-generation tokens banned)."""
    sampling = SamplingParams(temperature=0.0, **kw)
    sampling.logit_bias = [(t, None) for t in engine.vocab.eog_ids]
    return GenerationRequest(engine.vocab.tokenize(prompt, add_special=True), sampling,
                             n_predict=-1, stream=True, cache_prompt=False)


def short(engine: Engine, prompt: str = "import os\n", n: int = 4, **kw) -> GenerationRequest:
    return GenerationRequest(engine.vocab.tokenize(prompt, add_special=True),
                             SamplingParams(**{"temperature": 0.0, **kw}), n_predict=n,
                             cache_prompt=False)


async def collect(engine: Engine, *requests: GenerationRequest) -> list:
    events = []
    async for batch in aio.generate(engine, list(requests)):
        events += batch
    return events


async def until_idle(engine: Engine, timeout: float = 1.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        state = engine.debug_state()
        if not state["n_active"] and not state["n_waiting"] and not state["n_sequences"]:
            return
        await asyncio.sleep(0.005)
    raise AssertionError(f"the engine still holds requests: {engine.debug_state()}")


def test_cancel_lands_within_one_decode_step(engine):
    """Another stream keeps the batch stepping; the cancelled one leaves at the next step."""
    steps_at_cancel: list[int] = []
    process_cancel = engine._cancel

    def recording_cancel(group_id: int) -> None:
        steps_at_cancel.append(engine.metrics.n_decode_total)
        process_cancel(group_id)

    engine._cancel = recording_cancel

    async def scenario() -> tuple[int, int]:
        keeper = aio.generate(engine, [endless(engine, "import os\n")])
        await anext(keeper)
        victim = aio.generate(engine, [endless(engine)])
        seen = 0
        async for batch in victim:
            seen += sum(isinstance(e, TokenEvent) for e in batch)
            if seen >= 3:
                break
        step_before = engine.metrics.n_decode_total
        await victim.aclose()  # what a client disconnect does to the replica's generator
        for _ in range(1000):
            if steps_at_cancel and engine.n_active == 1:
                break
            await asyncio.sleep(0.001)
        await keeper.aclose()
        await until_idle(engine)
        return step_before, steps_at_cancel[0]

    before, at_cancel = asyncio.run(scenario())
    assert at_cancel - before <= 1
    assert engine.n_cancelled == 2


def test_a_failing_launch_fails_that_request_only(engine, monkeypatch):
    real = admission.make_sampler

    def sampler_or_fault(sampling, *args, **kw):
        if sampling.seed == 4242:
            raise RuntimeError("injected sampler fault")
        return real(sampling, *args, **kw)

    monkeypatch.setattr(admission, "make_sampler", sampler_or_fault)

    async def scenario():
        return await asyncio.gather(collect(engine, short(engine, seed=4242)),
                                    collect(engine, short(engine, "x = 1\n")))

    failed, served = asyncio.run(scenario())
    assert [type(e) for e in failed] == [ErrorEvent]
    assert failed[0].code == 500 and "injected sampler fault" in failed[0].message
    assert isinstance(served[-1], FinalEvent) and served[-1].n_predicted == 4
    assert engine.alive
    asyncio.run(until_idle(engine))


def test_a_sampler_failing_mid_batch_fails_that_request_only(engine, monkeypatch):
    """The sampler runs inside the batched decode step: its failure must not fail the batch."""
    real = admission.make_sampler

    def faulty_or_real(sampling, *args, **kw):
        chain = real(sampling, *args, **kw)
        if sampling.seed != 4343:
            return chain
        calls = {"n": 0}

        def sample(logprobs):
            calls["n"] += 1
            if calls["n"] > 3:
                raise RuntimeError("injected decode fault")
            return chain(logprobs)

        return sample

    monkeypatch.setattr(admission, "make_sampler", faulty_or_real)
    alone = asyncio.run(collect(engine, short(engine, "x = 1\n", n=12)))[-1]

    async def scenario():
        return await asyncio.gather(
            collect(engine, short(engine, n=12, seed=4343, temperature=0.5)),
            collect(engine, short(engine, "x = 1\n", n=12)))

    failed, served = asyncio.run(scenario())
    assert isinstance(failed[-1], ErrorEvent) and "injected decode fault" in failed[-1].message
    assert isinstance(served[-1], FinalEvent) and served[-1].tokens == alone.tokens
    assert engine.alive
    asyncio.run(until_idle(engine))


def test_a_failing_token_step_fails_that_request_only(engine, monkeypatch):
    real = Engine._probs

    def probs_or_fault(self, token, sent, recorded, sampling):
        if sampling.n_probs == 7:
            raise RuntimeError("injected token fault")
        return real(self, token, sent, recorded, sampling)

    monkeypatch.setattr(Engine, "_probs", probs_or_fault)

    async def scenario():
        return await asyncio.gather(collect(engine, short(engine, n=8, n_probs=7)),
                                    collect(engine, short(engine, "x = 1\n", n=8, n_probs=2)))

    failed, served = asyncio.run(scenario())
    assert isinstance(failed[-1], ErrorEvent) and "injected token fault" in failed[-1].message
    final = served[-1]
    assert isinstance(final, FinalEvent) and final.n_predicted == 8 and len(final.probs) == 8
    assert engine.alive
    asyncio.run(until_idle(engine))


def test_queue_bound_refuses_with_503_and_admits_in_arrival_order(engine):
    """2 slots, 2 queued; the 5th is refused at once; the queue is served first come first."""

    async def scenario():
        holders = [aio.generate(engine, [endless(engine)]) for _ in range(2)]
        for h in holders:
            await anext(h)
        order: list[int] = []

        async def queued(i: int) -> None:
            await collect(engine, short(engine, f"# request {i}\n", n=2))
            order.append(i)

        waiting = []
        for i in range(2):
            waiting.append(asyncio.create_task(queued(i)))
            while engine.n_waiting < i + 1:
                await asyncio.sleep(0.001)
        with pytest.raises(EngineError) as refused:
            await anext(aio.generate(engine, [short(engine)]))
        for h in holders[:1]:  # one slot frees: the queue drains through it, in order
            await h.aclose()
        await asyncio.gather(*waiting)
        await holders[1].aclose()
        await until_idle(engine)
        return refused.value, order

    refused, order = asyncio.run(scenario())
    assert (refused.code, refused.type) == (503, "unavailable_error")
    assert order == [0, 1]


def test_loop_death_fails_what_it_held_and_refuses_after(engine):
    async def scenario():
        active = aio.generate(engine, [endless(engine)])
        await anext(active)
        engine.inject_fault(RuntimeError("loop killed"))
        rest = [e async for batch in active for e in batch]
        return rest

    rest = asyncio.run(scenario())
    assert isinstance(rest[-1], ErrorEvent) and "loop killed" in rest[-1].message
    assert not engine.alive and "loop killed" in str(engine.error)
    with pytest.raises(EngineError) as refused:
        engine.submit([short(engine)], lambda events: None)
    assert refused.value.code == 503
