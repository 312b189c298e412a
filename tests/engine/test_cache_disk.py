"""The prompt cache's disk tier (engine/disk_cache.py), on the engine alone (no Ray): a restarted
engine and a second engine on the same folder reuse what the first computed, with the same
tokens as from RAM (plain, quantized, windowed and state-space caches); entries evicted from RAM
go to disk; a torn file, a foreign model's file and another version's file are never loaded and
are removed; the folder stays within its bound."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from deployments.cli import command as cli
from engine.disk_files import NAME
from engine.types import FinalEvent, GenerationRequest, SamplingParams

from ..conftest import MODEL, run_engine
from ..zoo import reference_ids

PROMPT = ("def disk_cached(values, scale):\n    total = 0\n    for v in values:\n"
          "        total += v * scale\n    return total / len(values)\n")
N_PREDICT = 6


@contextmanager
def disk_engine(folder: Path, model: str = MODEL, eager: int = 16, **config) -> Iterator:
    """An engine whose disk tier writes every entry of ``eager`` tokens or more when made."""
    from engine.model import load_model
    from engine.scheduler import Engine, EngineConfig

    settings = {"n_parallel": 1, "n_ctx": 256, "n_batch": 64, "cache_disk": str(folder), **config}
    engine = Engine(load_model(model), EngineConfig(**settings))
    engine.prefix_cache.disk.eager_tokens = eager
    engine.start()
    try:
        yield engine
    finally:
        engine.stop()


def complete(engine, text: str = PROMPT) -> FinalEvent:
    req = GenerationRequest(engine.vocab.tokenize(text, add_special=True),
                            SamplingParams(temperature=0.0), n_predict=N_PREDICT)
    return next(e for e in run_engine(engine, req) if isinstance(e, FinalEvent))


def files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir() if NAME.match(p.name))


def test_the_flags_reach_the_config():
    args = cli.graph_args(cli.parse(["-m", MODEL, "--cache-disk", "/tmp/kv",
                                     "--cache-disk-mib", "512"], {}))
    assert (args.cache_disk, args.cache_disk_mib) == ("/tmp/kv", 512)
    assert cli.graph_args(cli.parse(["-m", MODEL], {})).cache_disk is None


def test_a_sharded_replica_refuses_the_tier(tmp_path, capsys):
    """Each rank holds its own part of every KV cache: the command stops at start, naming it."""
    with pytest.raises(SystemExit) as exited:
        cli.main(["-m", MODEL, "--shards", "2", "--cache-disk", str(tmp_path), "--dump-config"])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert "--cache-disk" in err and "sharded replica" in err
    assert list(tmp_path.iterdir()) == []


def test_a_restarted_engine_and_a_second_one_read_it_from_disk(tmp_path):
    with disk_engine(tmp_path) as first, disk_engine(tmp_path) as second:
        cold = complete(first)
        n = cold.n_prompt
        first.prefix_cache.disk.flush()
        assert len(files(tmp_path)) == 1  # the prompt and its answer
        shared = complete(second)  # a replica of the node: nothing in its RAM yet
        warm_ram = complete(first)
    assert (cold.timings.cache_n, warm_ram.timings.cache_n) == (0, n - 1)
    assert shared.timings.cache_n == n - 1 and shared.tokens == warm_ram.tokens == cold.tokens
    metrics = second.metrics_snapshot()
    assert metrics["cache_disk_hits_total"] == 1
    assert metrics["prompt_tokens_cache_disk_total"] == n - 1
    assert metrics["prompt_tokens_cached_total"] == n - 1
    assert second.slot_states()[0]["task"]["n_cache"] == n - 1
    with disk_engine(tmp_path) as restarted:
        again = complete(restarted)
    assert again.timings.cache_n == n - 1 and again.tokens == cold.tokens


def test_entries_leaving_ram_go_to_disk(tmp_path):
    other = "import json\nimport sys\n\nprint(json.dumps(sys.argv, indent=2))\n" * 2
    with disk_engine(tmp_path, eager=10_000, cache_entries=1) as engine:
        cold = complete(engine)
        assert files(tmp_path) == []  # short entries stay in RAM while they fit
        complete(engine, other)  # evicts the first
        engine.prefix_cache.disk.flush()
        assert len(files(tmp_path)) == 1
        back = complete(engine)
    assert back.timings.cache_n == cold.n_prompt - 1 and back.tokens == cold.tokens
    assert engine.metrics_snapshot()["cache_disk_hits_total"] == 1


def test_a_torn_file_and_another_versions_file_are_removed_unread(tmp_path):
    with disk_engine(tmp_path) as engine:
        cold = complete(engine)
    (path,) = files(tmp_path)
    names = engine.prefix_cache.disk.names
    stale = tmp_path / path.name.replace(f"-{names.build}-", "-00000000-")
    stale.write_bytes(path.read_bytes())  # this model's file, of another mlxray version
    path.write_bytes(path.read_bytes()[:-100])  # torn
    with disk_engine(tmp_path, eager=10_000) as engine:
        again = complete(engine)
    assert again.timings.cache_n == 0 and again.tokens == cold.tokens
    assert files(tmp_path) == []


def test_a_foreign_models_file_is_never_loaded(tmp_path, zoo):
    with disk_engine(tmp_path) as tiny:
        complete(tiny)
    (theirs,) = files(tmp_path)
    with disk_engine(tmp_path, model=str(zoo["llama"]), eager=10_000) as engine:
        prompt = engine.vocab.tokenize(PROMPT, add_special=True)
        # the tiny model's file under the name this model gives the same prompt
        mine = tmp_path / engine.prefix_cache.disk.names.name(prompt[:-1], "model")
        mine.write_bytes(theirs.read_bytes())
        assert complete(engine).timings.cache_n == 0
    assert not mine.exists()  # not what its name says: removed
    assert theirs.exists()  # another setup's file: left alone, counted against the bound


def test_a_file_renamed_to_another_prompt_is_removed_unread(tmp_path):
    with disk_engine(tmp_path) as engine:
        complete(engine)
    (path,) = files(tmp_path)
    other = "# another file\n" + PROMPT
    with disk_engine(tmp_path, eager=10_000) as engine:
        prompt = engine.vocab.tokenize(other, add_special=True)
        renamed = tmp_path / engine.prefix_cache.disk.names.name(prompt[:-1], "model")
        path.rename(renamed)  # this setup's file, under the name another prompt would have
        assert complete(engine, other).timings.cache_n == 0
    assert not renamed.exists()


def test_the_folder_stays_within_its_bound(tmp_path):
    with disk_engine(tmp_path) as engine:
        complete(engine)
        engine.prefix_cache.disk.flush()
        size = files(tmp_path)[0].stat().st_size
        engine.prefix_cache.disk.max_bytes = int(2.5 * size)
        for i in range(5):
            complete(engine, f"# variant {i}\n" + PROMPT)
        engine.prefix_cache.disk.flush()
        kept = files(tmp_path)
        assert len(kept) == 2 and sum(p.stat().st_size for p in kept) <= 2.5 * size
    with disk_engine(tmp_path, eager=10_000) as engine:  # the least recently used went first
        newest, oldest = (complete(engine, f"# variant {i}\n" + PROMPT) for i in (4, 0))
    assert newest.timings.cache_n == newest.n_prompt - 1
    assert oldest.timings.cache_n < 16  # "# variant": from RAM, not the file evicted
    assert engine.metrics_snapshot()["cache_disk_hits_total"] == 1


def test_quantized_kv_from_disk_gives_the_tokens_from_ram(tmp_path):
    with disk_engine(tmp_path, kv_cache_type="q8_0") as engine:
        complete(engine)
        from_ram = complete(engine)
    with disk_engine(tmp_path, kv_cache_type="q8_0") as engine:
        from_disk = complete(engine)
    with disk_engine(tmp_path) as plain:  # an f16 engine does not read q8_0 files
        assert complete(plain).timings.cache_n == 0
    assert from_ram.timings.cache_n == from_disk.timings.cache_n == from_ram.n_prompt - 1
    assert from_disk.tokens == from_ram.tokens


@pytest.mark.parametrize("name", ["gemma3_text", "mamba2"])
def test_snapshots_from_disk_give_the_reference_tokens(tmp_path, zoo, name):
    with disk_engine(tmp_path, model=str(zoo[name])) as engine:
        prompt = engine.vocab.tokenize(PROMPT, add_special=True)
        cold = complete(engine)
    with disk_engine(tmp_path, model=str(zoo[name])) as engine:
        warm = complete(engine)
    assert warm.timings.cache_n == len(prompt) - 1
    assert warm.tokens == cold.tokens == reference_ids(zoo[name], prompt, N_PREDICT)
