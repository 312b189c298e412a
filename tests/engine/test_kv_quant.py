"""The quantized KV cache (-ctk/-ctv q8_0|q4_0), batched, on the engine alone (no Ray): greedy
output against the unquantized cache, batched against alone, the prefix cache, slot files, and
the flags."""

from __future__ import annotations

import asyncio

import mlx.core as mx
import pytest

from deployments.cli import command as cli
from engine import aio, slot_store
from engine.kv_quant import QuantizedBatchKVCache, QuantizedSequenceCache
from engine.model import load_model
from engine.scheduler import Engine, EngineConfig
from engine.types import FinalEvent, GenerationRequest, SamplingParams

from ..conftest import MODEL, run_engine

PROMPTS = ["def main():\n", "import os\n", "class Foo:\n    def __init__(self",
           "    for i in range("]
# the first tokens q8_0 must decode exactly as the unquantized cache does; measured on the CPU:
# all 64 of 64 on 9 code prompts (q4_0: 0 to 64, median 6)
N_AGREE = 16


def _engine(kv_cache_type: str, n_parallel: int = 4):
    eng = Engine(load_model(MODEL), EngineConfig(n_parallel=n_parallel, n_ctx=512, n_batch=16,
                                                 kv_cache_type=kv_cache_type))
    eng.start()
    yield eng
    eng.stop()


@pytest.fixture(scope="module")
def q8():
    yield from _engine("q8_0")


@pytest.fixture(scope="module")
def plain():
    yield from _engine("f16")


def greedy(engine: Engine, prompt: str, n: int = 24, **kw) -> GenerationRequest:
    return GenerationRequest(engine.vocab.tokenize(prompt, add_special=True),
                             SamplingParams(temperature=0.0), n_predict=n, **kw)


def finals(events) -> dict[int, FinalEvent]:
    return {e.index: e for e in events if isinstance(e, FinalEvent)}


def tokens_of(engine: Engine, prompt: str, n: int = 24, **kw) -> list[int]:
    return finals(run_engine(engine, greedy(engine, prompt, n, **kw)))[0].tokens


def test_the_engine_holds_quantized_caches(q8):
    layers = q8.kv.fresh()
    assert all(isinstance(c, QuantizedSequenceCache) and c.bits == 8 and c.group_size == 32
               for c in layers)
    merged = layers[0].merge([layers[0], q8.kv.fresh()[0]])
    assert isinstance(merged, QuantizedBatchKVCache)


def test_q8_0_agrees_with_the_unquantized_cache(q8, plain):
    for prompt in PROMPTS:
        quantized = tokens_of(q8, prompt, cache_prompt=False)
        reference = tokens_of(plain, prompt, cache_prompt=False)
        assert quantized[:N_AGREE] == reference[:N_AGREE], prompt


def test_batched_equals_alone(q8):
    alone = [tokens_of(q8, p, 40, cache_prompt=False) for p in PROMPTS]
    requests = [greedy(q8, p, 40, cache_prompt=False, index=i) for i, p in enumerate(PROMPTS)]
    together = finals(run_engine(q8, *requests))
    assert [together[i].tokens for i in range(len(PROMPTS))] == alone


def test_a_sequence_joining_a_running_batch_equals_alone(q8):
    """The joiner's cache is merged into the running batch's (extend: rows of other lengths)."""
    first, joiner = PROMPTS[2], PROMPTS[1]
    alone = tokens_of(q8, joiner, 24, cache_prompt=False)
    long_alone = tokens_of(q8, first, 48, cache_prompt=False)

    async def staggered() -> tuple[list[int], list[int]]:
        running = aio.generate(q8, [greedy(q8, first, 48, cache_prompt=False, stream=True)])
        events = [e async for batch in _take(running, 8) for e in batch]
        joined = asyncio.ensure_future(_collect(aio.generate(
            q8, [greedy(q8, joiner, 24, cache_prompt=False)])))
        events += [e async for batch in running for e in batch]
        return finals(events)[0].tokens, finals(await joined)[0].tokens

    long_tokens, joined_tokens = asyncio.run(staggered())
    assert joined_tokens == alone and long_tokens == long_alone


async def _take(stream, n: int):
    for _ in range(n):
        yield await stream.__anext__()


async def _collect(stream) -> list:
    return [e async for batch in stream for e in batch]


def test_repeated_prompt_reuses_the_quantized_prefix(q8):
    prompt = "def quantized_prefix(a, b):\n    return a * b\n" * 3
    first = finals(run_engine(q8, greedy(q8, prompt, 6)))[0]
    second = finals(run_engine(q8, greedy(q8, prompt, 6)))[0]
    assert second.timings.cache_n == first.n_prompt - 1
    assert second.timings.prompt_n == 1
    assert second.tokens == first.tokens
    cache, n = q8.run_on_loop(lambda e: e.prefix_cache.longest(
        q8.vocab.tokenize(prompt, add_special=True)))
    assert n > 0 and all(isinstance(c, QuantizedSequenceCache) for c in cache)


def test_a_shared_prefix_is_trimmed_and_reused(q8):
    head = "def shared_head(x):\n    y = x + 1\n    return y\n" * 2
    first = finals(run_engine(q8, greedy(q8, head + "print(1)", 4)))[0]
    other = finals(run_engine(q8, greedy(q8, head + "import sys", 4)))[0]
    n_head = len(q8.vocab.tokenize(head, add_special=True))
    assert other.timings.cache_n >= n_head - 1 > 0
    fresh = finals(run_engine(q8, greedy(q8, head + "import sys", 4, cache_prompt=False)))[0]
    assert first.n_prompt > 0 and other.tokens == fresh.tokens


def test_a_slot_file_round_trips(q8, tmp_path):
    prompt = "def saved_slot():\n    return 42\n" * 2
    first = finals(run_engine(q8, greedy(q8, prompt, 3, id_slot=1)))[0]
    path = tmp_path / "slot.bin"
    saved = q8.run_on_loop(lambda e: slot_store.save(e, 1, path, "slot.bin"))
    q8.run_on_loop(lambda e: slot_store.erase(e, 1))
    restored = q8.run_on_loop(lambda e: slot_store.restore(e, 2, path, "slot.bin"))
    assert restored["n_restored"] == saved["n_saved"] > 0
    again = finals(run_engine(q8, greedy(q8, prompt, 3, id_slot=2)))[0]
    assert again.timings.cache_n == first.n_prompt - 1 and again.tokens == first.tokens


def test_q4_0_decodes_and_is_smaller():
    plain, q4 = QuantizedSequenceCache(8), QuantizedSequenceCache(4)
    x = mx.random.normal((1, 2, 64, 32))
    plain.update_and_fetch(x, x)
    q4.update_and_fetch(x, x)
    assert q4.nbytes < plain.nbytes
    engine = next(gen := _engine("q4_0", n_parallel=2))
    try:
        assert len(tokens_of(engine, PROMPTS[0], 8, cache_prompt=False)) == 8
    finally:
        next(gen, None)


@pytest.mark.parametrize("argv, expected", [
    (["-ctk", "q8_0", "-ctv", "q8_0"], "q8_0"),
    (["--cache-type-k", "q4_0", "--cache-type-v", "q4_0"], "q4_0"),
    (["-ctk", "f32", "-ctv", "f32"], "f32"),
    ([], "f16"),
])
def test_cache_type_flags_reach_the_config(argv, expected):
    ns = cli.parse(["-m", MODEL, *argv], {})
    assert cli.graph_args(ns).kv_cache_type == expected


def test_cache_type_from_the_environment():
    env = {"LLAMA_ARG_CACHE_TYPE_K": "q8_0", "LLAMA_ARG_CACHE_TYPE_V": "q8_0"}
    assert cli.graph_args(cli.parse(["-m", MODEL], env)).kv_cache_type == "q8_0"


@pytest.mark.parametrize("argv, message", [
    (["-ctk", "q8_0"], "must be equal"),
    (["-ctk", "q8_0", "-ctv", "q4_0"], "must be equal"),
    (["-ctk", "q5_1", "-ctv", "q5_1"], "Unsupported cache type: q5_1"),
])
def test_cache_types_refused(argv, message):
    with pytest.raises((cli.Refused, ValueError), match=message):
        cli.graph_args(cli.parse(["-m", MODEL, *argv], {}))


def test_other_families(tmp_path):
    """Qwen3 (q/k norms) with 4-bit weights: q8_0 decodes as the unquantized cache does. A model
    with a sliding window, or heads narrower than a group, is refused at load, saying why."""
    from ..zoo import QWEN3, Family, build_family, build_zoo

    wide = Family("qwen3-4bit-wide", {**QWEN3, "head_dim": 32}, "", bits=4)
    loaded = load_model(str(build_family(wide, tmp_path / wide.name)))
    outputs = []
    for cache_type in ("f32", "q8_0"):
        engine = Engine(loaded, EngineConfig(n_parallel=2, n_ctx=256, n_batch=16,
                                             kv_cache_type=cache_type))
        engine.start()
        try:
            outputs.append(tokens_of(engine, PROMPTS[0], N_AGREE, cache_prompt=False))
        finally:
            engine.stop()
    assert outputs[0] == outputs[1]
    folders = build_zoo(tmp_path, ("qwen3", "gemma3_text"))
    with pytest.raises(ValueError, match="RotatingKVCache"):
        Engine(load_model(str(folders["gemma3_text"])), EngineConfig(kv_cache_type="q8_0"))
    with pytest.raises(ValueError, match="groups of 32 values of each head; this model's "
                                         "heads have 16"):
        Engine(load_model(str(folders["qwen3"])), EngineConfig(kv_cache_type="q4_0"))


def test_bench_measures_the_cache_bytes():
    """bench/kv_quant.py's memory figure: per token, 2 layers x (K, V) x 2 heads x 32 values;
    f32: 4 bytes a value; q8_0: 1 byte, and a float32 scale and bias per 32 values."""
    from bench.kv_quant import measure, parse_args

    args = parse_args(["--context", "40", "--tokens", "4", "--n-batch", "16"])
    loaded = load_model(MODEL)
    per_token = {t: (r := measure(loaded, t, args))["bytes"] / r["n_tokens"]
                 for t in ("f32", "q8_0", "q4_0")}
    assert per_token == {"f32": 8 * 32 * 4, "q8_0": 8 * (32 + 8), "q4_0": 8 * (16 + 8)}
