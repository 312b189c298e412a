"""llama-server's ``-cram, --cache-ram N``: the prefix cache's budget in MiB of KV arrays. The flag
and its variable reach the config; in the engine (no Ray) entries are evicted least recently used
until their bytes fit, an entry past the whole budget is not stored, and 0 keeps nothing."""

from __future__ import annotations

import pytest

from deployments.cli import command as cli
from engine.prefix_cache import PrefixCache, cache_bytes
from engine.types import FinalEvent, GenerationRequest, SamplingParams

from ..conftest import MODEL, run_engine

FIRST = "def first_prompt(a, b):\n    return a * b + 1\n" * 3
SECOND = "import os\nimport sys\nprint(os.getcwd(), sys.argv)\n" * 3


@pytest.mark.parametrize("argv, env, expected", [
    ([], {}, 8192),  # llama-server's default
    (["-cram", "512"], {}, 512),
    (["--cache-ram", "-1"], {}, -1),
    (["--cache-ram", "-5"], {}, -1),  # any negative is no limit
    (["-cram", "0"], {}, 0),
    ([], {"LLAMA_ARG_CACHE_RAM": "64"}, 64),
    (["-cram", "32"], {"LLAMA_ARG_CACHE_RAM": "64"}, 32),  # the flag overrides its variable
])
def test_cache_ram_flag_reaches_the_config(argv, env, expected):
    assert cli.graph_args(cli.parse(["-m", MODEL, *argv], env)).cache_ram_mib == expected


def test_cache_bytes():
    assert cache_bytes(-1) is None and cache_bytes(0) == 0 and cache_bytes(2) == 2 << 20


def engine_with(cache_ram_mib: int):
    from engine.model import load_model
    from engine.scheduler import Engine, EngineConfig

    engine = Engine(load_model(MODEL), EngineConfig(n_parallel=1, n_ctx=512, n_batch=16,
                                                    cache_entries=8,
                                                    cache_ram_mib=cache_ram_mib))
    engine.start()
    return engine


def complete(engine, text: str) -> FinalEvent:
    req = GenerationRequest(engine.vocab.tokenize(text, add_special=True),
                            SamplingParams(temperature=0.0), n_predict=4)
    return next(e for e in run_engine(engine, req) if isinstance(e, FinalEvent))


def shared_prefix(engine, a: str, b: str) -> int:
    ids_a, ids_b = (engine.vocab.tokenize(t, add_special=True) for t in (a, b))
    return next(i for i, (x, y) in enumerate(zip(ids_a, ids_b)) if x != y)


@pytest.fixture(scope="module")
def one_entry_budget() -> int:
    """Bytes that hold either prompt's cache but not both: measured on an unbounded cache."""
    engine = engine_with(-1)
    try:
        complete(engine, FIRST)
        one = engine.prefix_cache.nbytes
        complete(engine, SECOND)
        two = engine.prefix_cache.nbytes
    finally:
        engine.stop()
    assert len(engine.prefix_cache) == 2 and 0 < one < two
    return max(one, two - one)


def test_second_prompt_evicts_the_first_by_bytes(one_entry_budget):
    engine = engine_with(-1)
    try:
        engine.prefix_cache = PrefixCache(8, one_entry_budget)  # what cache_ram_mib builds
        first = complete(engine, FIRST)
        assert complete(engine, FIRST).timings.cache_n == first.n_prompt - 1  # it fits
        complete(engine, SECOND)
        assert len(engine.prefix_cache) == 1
        assert engine.prefix_cache.nbytes <= one_entry_budget
        # evicted: read again but for the tokens it shares with the second (its BOS)
        shared = shared_prefix(engine, FIRST, SECOND)
        assert complete(engine, FIRST).timings.cache_n == shared < first.n_prompt - 1
        assert complete(engine, SECOND).timings.cache_n == shared  # it evicted the second
    finally:
        engine.stop()


def test_entry_past_the_budget_is_skipped():
    engine = engine_with(-1)
    try:
        complete(engine, FIRST)
        tokens = engine.vocab.tokenize(FIRST, add_special=True)
        kept, n = engine.prefix_cache.longest(tokens)
    finally:
        engine.stop()
    assert kept is not None and n > 0
    size = sum(c.nbytes for c in kept)
    tight = PrefixCache(8, size - 1)
    tight.store(tokens[:n], kept)
    assert len(tight) == 0 and tight.nbytes == 0
    exact = PrefixCache(8, size)
    exact.store(tokens[:n], kept)
    assert len(exact) == 1 and exact.nbytes == size


def test_cache_ram_zero_keeps_nothing():
    engine = engine_with(0)
    try:
        complete(engine, FIRST)
        assert complete(engine, FIRST).timings.cache_n == 0
        assert len(engine.prefix_cache) == 0
    finally:
        engine.stop()


def test_cache_ram_mib_bounds_the_engine_cache():
    engine = engine_with(1)
    try:
        assert engine.prefix_cache._lru.max_bytes == 1 << 20
        complete(engine, FIRST)
        assert 0 < engine.prefix_cache.nbytes <= 1 << 20
    finally:
        engine.stop()
