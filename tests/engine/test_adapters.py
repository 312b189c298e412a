"""LoRA adapters in the engine (no Ray): per-sequence deltas mixed in one batch, each sequence
equal to mlx-lm's own generation with its adapter loaded; the prefix cache keyed by adapter
settings; unloading an adapter in use waits for its sequences; DoRA and full fine-tunes fused
into a model of their own; the config's and the command line's adapters."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from deployments.api.config import GraphArgs
from deployments.cli import command as cli
from engine.types import FinalEvent, GenerationRequest, SamplingParams

from ..adapters import mlx_lm_greedy, write_adapter
from ..conftest import MODEL, batch_sizes, run_engine

PROMPT = "def main():\n"
N = 16


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("engine-adapters")
    return {
        "a": write_adapter(root / "a", seed=11),
        "b": write_adapter(root / "b", seed=12, num_layers=1, keys=["mlp.down_proj"]),
        "dora": write_adapter(root / "dora", seed=13, kind="dora", magnitude=0.2),
        "full": write_adapter(root / "full", seed=14, kind="full"),
    }


@pytest.fixture(scope="module")
def engine(folders) -> Iterator:
    from engine.lora import read_lora
    from engine.model import load_model
    from engine.scheduler import Engine, EngineConfig

    eng = Engine(load_model(MODEL), EngineConfig(n_parallel=4, n_ctx=256, n_batch=16))
    eng.start()
    eng.run_on_loop(lambda e: [e.adapters.add(read_lora(folders[n], n)) for n in "ab"])
    yield eng
    eng.stop()


def request(engine, adapters=(), index=0, cache_prompt=False, prompt=PROMPT):
    return GenerationRequest(engine.vocab.tokenize(prompt, add_special=True),
                             SamplingParams(temperature=0), n_predict=N, index=index,
                             cache_prompt=cache_prompt, adapters=tuple(adapters))


def finals(engine, *requests) -> dict[int, FinalEvent]:
    events = run_engine(engine, *requests)
    ended = {e.index: e for e in events if isinstance(e, FinalEvent)}
    assert len(ended) == len(requests), events
    return ended


def solo(engine, adapters=()) -> list[int]:
    return finals(engine, request(engine, adapters))[0].tokens


def test_each_adapter_equals_mlx_lm_with_it_loaded(engine, folders):
    assert solo(engine) == mlx_lm_greedy(PROMPT, N)
    for name in "ab":
        assert solo(engine, [(name, 1.0)]) == mlx_lm_greedy(PROMPT, N, folders[name])


def test_mixed_adapters_decode_in_one_batch_each_as_alone(engine):
    settings = [(), (("a", 1.0),), (("b", 1.0),), (("a", 0.5), ("b", 0.7))]
    alone = [solo(engine, s) for s in settings]
    assert len({tuple(t) for t in alone}) == 4  # four different outputs
    with batch_sizes(engine) as steps:
        together = finals(engine, *(request(engine, s, i) for i, s in enumerate(settings)))
    assert max(steps) == 4  # one decode step ran all four sequences
    assert [together[i].tokens for i in range(4)] == alone


def test_prefix_cache_never_serves_a_prefix_of_other_adapters(engine):
    prompt = "class Cache:\n    def get(self, key):\n" * 3
    n_prompt = len(request(engine, prompt=prompt).prompt_tokens)

    def cached(adapters) -> tuple[int, list[int]]:
        final = finals(engine, request(engine, adapters, cache_prompt=True, prompt=prompt))[0]
        return final.timings.cache_n, final.tokens

    _, base_tokens = cached(())
    assert cached(())[0] == n_prompt - 1  # the base's own prefix is reused
    quarter, tokens = cached((("a", 0.25),))  # settings never used before: a key of their own
    assert quarter == 0 and tokens != base_tokens
    assert cached((("a", 0.25),)) == (n_prompt - 1, tokens)
    assert cached((("a", 0.75),))[0] == 0  # another scale is another key


def test_slot_files_keep_the_adapter_settings(engine, tmp_path):
    from engine import slot_store

    prompt = "def slot_file(path):\n    return open(path).read()\n" * 2
    adapters = (("b", 0.5),)
    final = finals(engine, request(engine, adapters, cache_prompt=True, prompt=prompt))[0]
    path = tmp_path / "slot.bin"
    saved = engine.run_on_loop(lambda e: slot_store.save(e, final.id_slot, path, "slot.bin"))
    assert saved["n_saved"] > 0
    engine.run_on_loop(lambda e: slot_store.erase(e, final.id_slot))
    again = finals(engine, request(engine, adapters, cache_prompt=True, prompt=prompt))[0]
    assert again.timings.cache_n == 0  # erased
    engine.run_on_loop(lambda e: slot_store.erase(e, again.id_slot))
    engine.run_on_loop(lambda e: slot_store.restore(e, 0, path, "slot.bin"))
    restored = finals(engine, request(engine, adapters, cache_prompt=True, prompt=prompt))[0]
    assert restored.timings.cache_n > 0 and restored.tokens == final.tokens
    base = finals(engine, request(engine, (), cache_prompt=True, prompt=prompt))[0]
    # the restored state is the adapter's: the base reuses at most what other base prompts share
    assert base.timings.cache_n < 3 < restored.timings.cache_n


def test_unloading_waits_for_the_sequences_using_the_adapter(engine, folders):
    from engine.lora import read_lora

    engine.run_on_loop(lambda e: e.adapters.add(read_lora(folders["a"], "a2")))
    seen: list[bool] = []

    def unload_while_running(e) -> None:
        e.adapters.remove("a2", {"a2"})  # as if a sequence held it
        seen.append("a2" in e.adapters.loaded)
        e.adapters.collect(set())
        seen.append("a2" in e.adapters.loaded)

    engine.run_on_loop(unload_while_running)
    assert seen == [True, False]
    assert engine.adapters.check((("a2", 1.0),)) == "a2"


@pytest.mark.parametrize("kind", ["dora", "full"])
def test_dora_and_full_adapters_are_fused_as_mlx_lm_loads_them(folders, kind):
    from engine.model import load_model
    from engine.scheduler import Engine, EngineConfig

    eng = Engine(load_model(MODEL, str(folders[kind])), EngineConfig(n_parallel=1, n_ctx=128))
    eng.start()
    try:
        fused = finals(eng, request(eng))[0].tokens
    finally:
        eng.stop()
    assert fused == mlx_lm_greedy(PROMPT, N, folders[kind])
    assert fused != mlx_lm_greedy(PROMPT, N)


# ---- the configuration and the command line ---------------------------------------------------
def test_config_keeps_lora_per_request_and_makes_dora_a_model(folders):
    args = GraphArgs.model_validate({"alias": "tiny", "adapters": [
        str(folders["a"]), {"path": str(folders["dora"]), "name": "dora-1"},
        {"path": str(folders["b"]), "scale": 0.5}]})
    assert [(s.name, s.scale) for s in args.lora_specs()] == [("a", 1.0), ("b", 0.5)]
    base, fused = args.model_configs()
    assert (base.model_name, fused.model_name, fused.adapter) == (
        "tiny", "dora-1", str(folders["dora"]))
    assert fused.lora_specs() == ()


@pytest.mark.parametrize("bad, message", [
    ({"alias": "a"}, "'a' names both a model and an adapter"),
    ({"adapters": ["{a}", {"path": "{b}", "name": "a"}]}, "'a' names both"),
    ({"adapters": ["/nonexistent"]}, "not an mlx-lm adapter folder"),
    ({"adapters": [{"path": "{a}", "rank": 4}]}, "unknown: rank"),
])
def test_config_refuses_ambiguous_names_and_non_adapters(folders, bad, message):
    body = {"adapters": ["{a}"], **bad}
    body["adapters"] = [
        {k: (v.format(**folders) if isinstance(v, str) else v) for k, v in e.items()}
        if isinstance(e, dict) else e.format(**folders) for e in body["adapters"]]
    with pytest.raises(ValueError, match=message):
        GraphArgs.model_validate(body)


def test_init_without_apply_starts_every_adapter_at_zero(folders):
    from deployments.api.adapters import AdapterTable
    from deployments.api.schema import CompletionParams

    args = cli.graph_args(cli.parse(["--lora", str(folders["a"]), "--lora-init-without-apply"],
                                    {}))
    table = AdapterTable(args)
    assert [a["scale"] for a in table.listing()] == [0.0]
    params = CompletionParams()
    table.resolve(params, None)
    assert params.adapters == ()
    table.resolve(params, "a")  # naming it applies it at the scale it was loaded with
    assert params.adapters == (("a", 1.0),) and params.adapter_model == "a"


def test_command_line_adapters_keep_their_order_across_both_flags(folders):
    a, b = str(folders["a"]), str(folders["b"])
    argv = ["--lora-scaled", f"{b}:0.5", "--lora", a, "--lora-init-without-apply"]
    args = cli.graph_args(cli.parse(argv, {}))
    assert [(s.name, s.scale) for s in args.lora_specs()] == [("b", 0.5), ("a", 1.0)]
    assert args.lora_init_without_apply
    with pytest.raises(cli.Refused, match='"--lora-scaled": lora-scaled format: FNAME:SCALE'):
        cli.parse(["--lora-scaled", a], {})
