"""The prompt cache on every cache type (engine level, no Ray): a repeated, extended or edited
prompt reuses what it can on sliding-window, attention-sink and state-space/hybrid models
(engine/cache_snapshots.py), the counts it reports are the tokens it did not read, snapshots
count against ``cache_entries``, and erasing a slot drops them.

The models are the zoo's (tests/zoo.py); every answer is checked against mlx-lm's own greedy
generation, so a wrong cache shows as wrong ids."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from engine.cache_snapshots import Snapshots, segments
from engine.prefix_cache import Hit, PrefixCache
from engine.types import FinalEvent, GenerationRequest, SamplingParams

from ..conftest import run_engine, up
from ..zoo import FAMILIES, reference_ids

UNTRIMMABLE = ("gemma3_text", "gpt_oss", "qwen3_next", "mamba2", "gemma3_text-8bit")
SYSTEM = "# a module of small helpers\nimport os\nimport sys\n\n"
N_PREDICT = 6


@pytest.fixture(scope="module")
def engines(zoo) -> Iterator:
    """engines(name, **config) -> a running engine on that zoo model, made once per settings."""
    from engine.model import load_model
    from engine.scheduler import Engine, EngineConfig

    made: dict = {}

    def get(name: str, **config):
        key = (name, tuple(sorted(config.items())))
        if key not in made:
            settings = {"n_parallel": 2, "n_ctx": 256, "n_batch": 16, **config}
            made[key] = up(Engine(load_model(str(zoo[name])), EngineConfig(**settings)))
        return made[key]

    yield get
    for engine in made.values():
        engine.stop()


def tokens(engine, text: str) -> list[int]:
    return engine.vocab.tokenize(text, add_special=True)


def complete(engine, prompt: list[int], n: int = N_PREDICT, **fields) -> FinalEvent:
    req = GenerationRequest(prompt, SamplingParams(temperature=0.0), n_predict=n, **fields)
    events = run_engine(engine, req)
    final = [e for e in events if isinstance(e, FinalEvent)]
    assert final, events
    return final[0]


def read_tokens(engine, prompt: list[int], **fields) -> tuple[FinalEvent, int]:
    """The answer and the prompt tokens the model read for it (the last one is read by the first
    decode step, not counted by BatchGenerator's prefill counter)."""
    with engine._bg.stats() as stats:
        final = complete(engine, prompt, **fields)
    return final, stats.prompt_tokens + 1


# ---- the snapshot points -----------------------------------------------------------------------
def test_segments_cut_before_each_point():
    assert segments([1, 2, 3, 4, 5], [2, 4]) == [[1, 2], [3, 4], [5]]
    assert segments([1, 2, 3], []) == [[1, 2, 3]]
    assert segments([1, 2, 3], [0, 3]) == [[1, 2, 3]]


def test_points_follow_the_cache_layout(zoo, engines):
    by_name = {name: Snapshots(engines(name).loaded.model) for name in ("llama", "gemma3_text",
                                                                          "mamba2", "qwen3_next")}
    assert by_name["llama"].points(100, Hit(), -1, 2048) == []  # a KV cache always trims back
    # the window (16 tokens) is never filled: the entry of prompt and answer trims back
    assert by_name["gemma3_text"].points(8, Hit(), 7, 2048) == []
    assert by_name["gemma3_text"].points(8, Hit(), 8, 2048) == [7]
    assert by_name["gemma3_text"].points(8, Hit(), -1, 15) == []  # the slot ends first
    assert by_name["gemma3_text"].points(8, Hit(), -1, 16) == [7]
    assert by_name["mamba2"].points(30, Hit(), 10, 2048) == [29]
    # the branch point of an edit, none before what is reused, none twice
    assert by_name["qwen3_next"].points(30, Hit(None, 0, 16), 10, 2048) == [16, 29]
    assert by_name["qwen3_next"].points(30, Hit(None, 0, 15), 10, 2048) == [29]  # too short
    assert by_name["qwen3_next"].points(30, Hit([], 29, 29), 10, 2048) == []
    assert by_name["mamba2"].points(1, Hit(), 10, 2048) == []


# ---- the lookup --------------------------------------------------------------------------------
def kv_cache(n: int) -> list:
    import mlx.core as mx
    from mlx_lm.models.cache import KVCache

    cache = KVCache()
    cache.update_and_fetch(mx.zeros((1, 1, n, 2)), mx.zeros((1, 1, n, 2)))
    return [cache]


def state_cache() -> list:
    import mlx.core as mx
    from mlx_lm.models.cache import ArraysCache

    cache = ArraysCache(1)
    cache[0] = mx.zeros((1, 2))
    return [cache]


def test_lookup_reuses_an_exact_prefix_or_trims_what_can_be_trimmed():
    cache = PrefixCache(8)
    cache.store([1, 2, 3, 4, 5, 6], state_cache())  # shares 4 tokens, cannot be trimmed back
    hit = cache.lookup([1, 2, 3, 4, 9])
    assert (hit.cache, hit.n_reused, hit.n_shared) == (None, 0, 4)
    cache.store([1, 2, 3], state_cache())
    hit = cache.lookup([1, 2, 3, 4, 9])
    assert (hit.n_reused, hit.n_shared) == (3, 4) and hit.cache is not None
    assert cache.lookup([1, 2, 3]).n_reused == 0  # one prompt token is always read again
    cache.store([1, 2, 3, 4, 7, 8], kv_cache(6))  # trimmable: trimmed back to what is shared
    hit = cache.lookup([1, 2, 3, 4, 9])
    assert hit.n_reused == 4 and hit.cache[0].offset == 4
    hit = cache.lookup([1, 2, 3, 4, 7, 8])
    assert hit.n_reused == 5 and hit.cache[0].offset == 5
    assert cache.lookup([1, 2, 3, 4, 7, 8]).cache[0].offset == 5  # the entry is left whole


def test_a_hit_makes_its_entry_the_most_recently_used():
    cache = PrefixCache(2)
    cache.store([1, 2, 3], state_cache())
    cache.store([4, 5, 6], state_cache())
    assert cache.lookup([1, 2, 3, 9]).n_reused == 3
    cache.store([7, 8, 9], state_cache())  # evicts [4, 5, 6], not the entry just used
    assert len(cache) == 2
    assert cache.lookup([1, 2, 3, 9]).n_reused == 3
    assert cache.lookup([4, 5, 6, 9]).n_reused == 0
    assert cache.discard_prefixes([1, 2, 3, 9]) == 3 and len(cache) == 1


# ---- every family: repeat, extension, edit -----------------------------------------------------
@pytest.mark.parametrize("name", [f.name for f in FAMILIES])
def test_repeat_and_extension_reuse_the_prompt(zoo, engines, name):
    engine = engines(name)
    prompt = tokens(engine, f"def {name.replace('-', '_')}(a, b):\n    return a + b\n")
    assert len(prompt) > 16  # longer than the sliding windows
    first, read = read_tokens(engine, prompt)
    assert first.tokens == reference_ids(zoo[name], prompt, N_PREDICT)
    assert first.timings.cache_n + first.timings.prompt_n == len(prompt) and read == (
        first.timings.prompt_n)
    again, read = read_tokens(engine, prompt)
    assert (again.timings.cache_n, again.timings.prompt_n, read) == (len(prompt) - 1, 1, 1)
    assert again.tokens == first.tokens
    # the next turn: the prompt, its answer and more (the answer's cache is reused whole)
    longer = prompt + first.tokens + tokens(engine, "\n\nprint(1)")[1:]
    turn, read = read_tokens(engine, longer)
    assert turn.timings.cache_n == len(prompt) + N_PREDICT and read == turn.timings.prompt_n
    assert turn.tokens == reference_ids(zoo[name], longer, N_PREDICT)


@pytest.mark.parametrize("name", UNTRIMMABLE)
def test_an_edit_reuses_its_branch_point_next_time(zoo, engines, name):
    """An edited last message shares the system part: the first edit cannot reuse it (nothing
    was kept there), it keeps a snapshot where it left the cached prompt, the next edit from the
    same place reuses it."""
    engine = engines(name)
    system = tokens(engine, SYSTEM + f"# {name}\n")
    asks = [tokens(engine, f"def ask_{i}():\n    return {i} * {i}\n")[1:] for i in range(3)]
    complete(engine, system + asks[0])
    first_edit = complete(engine, system + asks[1])
    shared = len(system) + _common(asks[0], asks[1])
    assert first_edit.timings.cache_n == 0  # the sliding window or the state moved on
    assert shared >= 16
    second_edit, read = read_tokens(engine, system + asks[2])
    assert second_edit.timings.cache_n == len(system) + _common(asks[1], asks[2])
    assert read == second_edit.timings.prompt_n
    assert second_edit.tokens == reference_ids(zoo[name], system + asks[2], N_PREDICT)


@pytest.mark.parametrize("name", ["gemma3_text", "qwen3_next", "mamba2"])
def test_n_cmpl_children_start_from_the_parents_prompt(zoo, engines, name):
    engine = engines(name, n_parallel=3)
    prompt = tokens(engine, "class Children:\n    def __init__(self, n):\n        self.n = n\n")
    requests = [GenerationRequest(prompt, SamplingParams(temperature=0.0), n_predict=N_PREDICT,
                                  index=j, child=j > 0) for j in range(3)]
    with engine._bg.stats() as stats:
        events = run_engine(engine, *requests)
    finals = [e for e in events if isinstance(e, FinalEvent)]
    assert stats.prompt_tokens == len(prompt) - 1  # read once
    reference = reference_ids(zoo[name], prompt, N_PREDICT)
    assert [f.tokens for f in finals] == [reference] * 3
    repeat = [GenerationRequest(prompt, SamplingParams(temperature=0.0), n_predict=N_PREDICT,
                                index=j, child=j > 0) for j in range(3)]
    again = [e for e in run_engine(engine, *repeat) if isinstance(e, FinalEvent)]
    assert [(f.tokens, f.timings.cache_n) for f in again] == [(reference, len(prompt) - 1)] * 3


# ---- memory and bookkeeping --------------------------------------------------------------------
@pytest.mark.parametrize("name", ["gpt_oss", "mamba2"])
def test_snapshots_count_against_cache_entries(engines, name):
    engine = engines(name, cache_entries=3, n_parallel=1)
    prompts = [tokens(engine, f"def bounded_{i}(x):\n    return x ** {i}\n") for i in range(6)]
    for prompt in prompts:
        complete(engine, prompt)
        assert len(engine.prefix_cache) <= 3
    assert len(engine.prefix_cache) == 3  # the last prompt's snapshot and answer, one more
    assert complete(engine, prompts[-1]).timings.cache_n == len(prompts[-1]) - 1
    assert complete(engine, prompts[0]).timings.cache_n < len(prompts[0]) - 1  # evicted


def test_erasing_a_slot_drops_its_snapshots(engines):
    from engine import slot_store

    engine = engines("mamba2", n_parallel=1)
    prompt = tokens(engine, "def erased(x):\n    return -x\n")
    complete(engine, prompt)
    assert complete(engine, prompt).timings.cache_n == len(prompt) - 1
    erased = engine.run_on_loop(lambda e: slot_store.erase(e, 0))
    assert erased["n_erased"] == len(prompt) + N_PREDICT
    assert complete(engine, prompt).timings.cache_n == 0


def _common(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n
