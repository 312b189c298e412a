"""The engine alone (no Ray): greedy equality with mlx-lm, batching, stop rules, cancellation,
the prefix cache."""

from __future__ import annotations

import asyncio

import mlx.core as mx
import pytest

from deployments.api.config import GraphArgs
from engine import aio
from engine.scheduler import Engine
from engine.types import FinalEvent, Gather, GenerationRequest, SamplingParams, TokenEvent

from ..conftest import mlx_lm_ids, run_engine, running_engine

PROMPTS = ["def main():\n", "import os\n", "class Foo:\n    def __init__(self",
           "    for i in range("]


@pytest.fixture(scope="module")
def engine():
    yield from running_engine(4)


def greedy_request(engine: Engine, prompt: str, n: int = 24, **kw) -> GenerationRequest:
    return GenerationRequest(engine.vocab.tokenize(prompt, add_special=True),
                             SamplingParams(temperature=0.0), n_predict=n, **kw)


run = run_engine


def finals(events) -> dict[int, FinalEvent]:
    return {e.index: e for e in events if isinstance(e, FinalEvent)}


def mlx_lm_greedy(engine: Engine, prompt: str, n: int) -> list[int]:
    tokens = engine.vocab.tokenize(prompt, add_special=True)
    return mlx_lm_ids(engine.loaded.model, tokens, n, sampler=lambda x: mx.argmax(x, axis=-1))


def test_greedy_ids_equal_mlx_lm(engine):
    for prompt in PROMPTS:
        final = finals(run(engine, greedy_request(engine, prompt, cache_prompt=False)))[0]
        assert final.tokens == mlx_lm_greedy(engine, prompt, 24)


def test_batched_equals_alone(engine):
    alone = [finals(run(engine, greedy_request(engine, p, 40, cache_prompt=False)))[0].tokens
             for p in PROMPTS]
    requests = [greedy_request(engine, p, 40, cache_prompt=False, index=i)
                for i, p in enumerate(PROMPTS)]
    together = finals(run(engine, *requests))
    assert [together[i].tokens for i in range(4)] == alone


def test_stop_string_is_held_back_then_cut(engine):
    req = greedy_request(engine, "class Foo:\n    def __init__(self", 32, stop=["self."],
                         stream=True, cache_prompt=False)
    events = run(engine, req)
    texts = [e.text for e in events if isinstance(e, TokenEvent)]
    final = finals(events)[0]
    assert final.stop_type == "word" and final.stopping_word == "self."
    assert "" in texts  # " self" was held while it could start the stop word
    assert "".join(texts) == final.content
    assert not final.content.endswith("self")


def test_n_predict_zero_still_samples_one(engine):
    final = finals(run(engine, greedy_request(engine, "import os\n", 0, cache_prompt=False)))[0]
    assert final.n_predicted == 1 and final.stop_type == "limit"


def test_repeated_prompt_reuses_prefix(engine):
    prompt = "def reused_prefix(a, b):\n    return a + b\n" * 3
    first = finals(run(engine, greedy_request(engine, prompt, 4)))[0]
    second = finals(run(engine, greedy_request(engine, prompt, 4)))[0]
    assert first.timings.cache_n < 4  # at most "<s>def" from an earlier test
    assert second.timings.cache_n == first.n_prompt - 1
    assert second.timings.prompt_n == 1
    assert second.tokens == first.tokens


def test_cache_prompt_false_reevaluates(engine):
    prompt = "def no_reuse():\n    pass\n" * 3
    run(engine, greedy_request(engine, prompt, 2))
    again = finals(run(engine, greedy_request(engine, prompt, 2, cache_prompt=False)))[0]
    assert again.timings.cache_n == 0


def test_cancellation_frees_the_slot(engine):
    async def cancel_midway():
        req = greedy_request(engine, "def main():\n", 400, stream=True, cache_prompt=False,
                             ignore_eos=True)
        req.sampling.logit_bias = [(t, None) for t in engine.vocab.eog_ids]
        stream = aio.generate(engine, [req])
        seen = 0
        async for batch in stream:
            seen += sum(isinstance(e, TokenEvent) for e in batch)
            if seen >= 3:
                break
        await stream.aclose()
        for _ in range(200):
            if engine.n_active == 0:
                return seen
            await asyncio.sleep(0.01)
        raise AssertionError("the slot was not freed")

    assert asyncio.run(cancel_midway()) >= 3
    assert all(not s["is_processing"] for s in engine.slot_states())


def test_progress_events_per_chunk(engine):
    prompt = "x = 1\n" * 20
    req = greedy_request(engine, prompt, 2, stream=True, return_progress=True,
                         cache_prompt=False)
    total = len(req.prompt_tokens)
    progress = [e for e in run(engine, req) if type(e).__name__ == "ProgressEvent"]
    # llama.cpp: one frame at the start, then one per n_batch chunk, the last at the total
    assert [p.processed for p in progress] == [0, *range(16, total, 16), total]
    assert all(p.total == total for p in progress)


def test_n_cmpl_children_share_the_parents_prompt(engine):
    """The parent reads the prompt once; its children start from a copy of its KV cache (greedy
    children equal it), and all report the parent's prompt timings."""
    tokens = engine.vocab.tokenize("def shared(a, b):\n    return a * b\n" * 3, add_special=True)
    requests = [GenerationRequest(tokens, SamplingParams(temperature=0.0), n_predict=6,
                                  cache_prompt=False, index=j, child=j > 0) for j in range(4)]
    with engine._bg.stats() as stats:
        results = finals(run(engine, *requests))
    assert stats.prompt_tokens == len(tokens) - 1  # prefilled once (the last token is decoded)
    assert len({tuple(r.tokens) for r in results.values()}) == 1
    assert len({(r.timings.cache_n, r.timings.prompt_n, r.timings.prompt_ms)
                for r in results.values()}) == 1


def test_more_prompts_than_slots(engine):
    """Prompts of one request are separate tasks: six prompts on four slots all complete."""
    prompts = ["a = 1\n", "b = 2\n", "c = 3\n", "d = 4\n", "e = 5\n", "f = 6\n"]
    requests = [greedy_request(engine, p, 4, cache_prompt=False, index=i)
                for i, p in enumerate(prompts)]
    results = finals(run(engine, *requests))
    assert sorted(results) == list(range(6))
    alone = finals(run(engine, greedy_request(engine, prompts[5], 4, cache_prompt=False)))[0]
    assert results[5].tokens == alone.tokens


def test_stream_interval_gathers_tokens_after_the_first(engine):
    """With a gather interval, the first token leaves alone and the rest come in fuller batches
    (the interval is far longer than the whole generation here)."""
    async def batches():
        req = greedy_request(engine, "def main():\n", 12, stream=True, cache_prompt=False,
                             ignore_eos=True)
        req.sampling.logit_bias = [(t, None) for t in engine.vocab.eog_ids]
        gather = Gather(floor_s=2.0, max_s=2.0)
        return [batch async for batch in aio.generate(engine, [req], gather)]

    with_tokens = [b for b in asyncio.run(batches())
                   if any(isinstance(e, TokenEvent) for e in b)]
    assert len(with_tokens) == 2  # the first token at once, then the other eleven together
    assert isinstance(with_tokens[-1][-1], FinalEvent)


def test_gather_interval_grows_with_the_running_sequences():
    gather = Gather(floor_s=0.001, per_sequence_s=0.004, max_s=0.05)
    assert [gather.interval(n) for n in (0, 1, 4, 16)] == [0.001, 0.005, 0.017, 0.05]
    assert Gather().off and not gather.off
    assert GraphArgs(stream_interval_per_sequence_ms=0).gather.off  # llama-server's timing


def test_gather_holds_a_lone_stream_for_its_per_sequence_share(engine):
    """One running sequence with 2 s per sequence: after the first token, the rest arrive
    together (the last may leave alone: once its slot is free no sequence runs, no gather)."""
    async def batches(gather):
        req = greedy_request(engine, "def main():\n", 12, stream=True, cache_prompt=False,
                             ignore_eos=True)
        req.sampling.logit_bias = [(t, None) for t in engine.vocab.eog_ids]
        return [b async for b in aio.generate(engine, [req], gather)
                if any(isinstance(e, TokenEvent) for e in b)]

    got = asyncio.run(batches(Gather(per_sequence_s=2.0, max_s=5.0)))
    sizes = [sum(isinstance(e, TokenEvent) for e in b) for b in got]
    assert len(got) <= 3 and max(sizes) >= 9, sizes


def test_a_final_event_ends_the_gather(engine):
    """A 10 s gather: the final event still leaves as soon as the sequence ends."""
    async def timed():
        req = greedy_request(engine, "def main():\n", 6, stream=True, cache_prompt=False,
                             ignore_eos=True)
        loop = asyncio.get_running_loop()
        start = loop.time()
        batches = [b async for b in aio.generate(engine, [req], Gather(floor_s=10, max_s=10))]
        return loop.time() - start, batches

    elapsed, batches = asyncio.run(timed())
    assert isinstance(batches[-1][-1], FinalEvent)
    assert elapsed < 5


def test_slot_restore_copies_where_hard_links_fail(engine, tmp_path, monkeypatch):
    """A slot file on a volume without hard links (FAT, some network mounts) is copied under the
    name mx.load reads instead; the restored prefix is then reused."""
    import errno
    import os

    from engine import slot_store

    prompt = "def restored(a, b):\n    return a - b\n" * 2
    first = finals(run(engine, greedy_request(engine, prompt, 3, id_slot=2)))[0]
    path = tmp_path / "slot.bin"
    saved = engine.run_on_loop(lambda e: slot_store.save(e, 2, path, "slot.bin"))
    engine.run_on_loop(lambda e: slot_store.erase(e, 2))

    def no_links(src, dst, **kw):
        raise OSError(errno.EPERM, "Operation not permitted")

    monkeypatch.setattr(os, "link", no_links)
    restored = engine.run_on_loop(lambda e: slot_store.restore(e, 3, path, "slot.bin"))
    assert restored["n_restored"] == saved["n_saved"] > 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["slot.bin"]  # the copy is gone
    again = finals(run(engine, greedy_request(engine, prompt, 3, id_slot=3)))[0]
    assert again.timings.cache_n == first.n_prompt - 1 and again.tokens == first.tokens


def first_token_steps(engine: Engine, prompts: list[str]) -> list[int]:
    """The sink call (one per engine step) in which each prompt of one burst got its first
    token: the prompts go in as one request, so one sink sees every step."""
    import threading

    calls: list[list] = []
    done = threading.Event()

    def sink(events: list) -> None:
        calls.append(events)
        if sum(isinstance(e, FinalEvent) for batch in calls for e in batch) == len(prompts):
            done.set()

    requests = [greedy_request(engine, p, 2, cache_prompt=False, index=i, stream=True)
                for i, p in enumerate(prompts)]
    engine.submit(requests, sink)
    assert done.wait(60)
    firsts = {}
    for step, batch in enumerate(calls):
        for e in batch:
            if isinstance(e, TokenEvent):
                firsts.setdefault(e.index, step)
    return [firsts[i] for i in range(len(prompts))]


def test_a_burst_is_read_in_n_batch_waves(engine):
    """Four prompts of 30-odd tokens with n_batch 16: read one after the other (16 tokens a
    step), the first gets its first token steps before the last; read as one batch (the waves
    off), all four get theirs in the same step."""
    prompts = [f"def function_number_{i}(alpha, beta, gamma):\n    return alpha * {i} + beta"
               for i in range(4)]
    assert all(len(engine.vocab.tokenize(p, add_special=True)) > 16 for p in prompts)
    waves = first_token_steps(engine, prompts)
    assert waves == sorted(waves) and waves[0] < waves[-1]
    engine.config.prefill_waves = False
    try:
        together = first_token_steps(engine, prompts)
    finally:
        engine.config.prefill_waves = True
    assert len(set(together)) == 1


def test_wave_size_fills_the_token_budget_in_arrival_order():
    from engine.prefill_waves import wave_size

    assert wave_size([], [64] * 16, 512) == 8
    assert wave_size([], [600], 512) == 1  # one prompt at least, read a chunk a step
    assert wave_size([64, 0], [64] * 16, 512) == 9  # 2 reading (one only its last token) + 7
    assert wave_size([512], [10], 512) == 1  # the budget is spent: the waiting one waits
    assert wave_size([], [], 512) == 1
