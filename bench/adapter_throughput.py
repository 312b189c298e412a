"""Aggregate decode throughput with LoRA adapters: 8 sequences in one engine batch, half on the
base model and a quarter on each of two adapters, against the base model alone.

    python -m bench.adapter_throughput [N_PREDICT] [REPEATS]

Engine level (no HTTP), temperature 1 without end of generation so every sequence decodes
N_PREDICT tokens. Two engines on the same weights: one with no adapter loaded (the base model
alone), one with two random rank-8 adapters on every Linear of both layers (mlx-lm's format,
seeded). Configurations take turns REPEATS times (each first in turn); the figures are the best
wall-clock tokens/s of each, and the median tokens per CPU second of this process (robust to
the neighbours' load on a shared machine):

- ``base_alone``: 8 base sequences on the engine without adapters;
- ``base_with_adapters_loaded``: 8 base sequences on the adapted engine (the wrappers' cost
  when no sequence uses them);
- ``mixed``: 4 base, 2 on adapter a, 2 on adapter b, in one batch (per-row deltas).
"""

from __future__ import annotations

import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path

from engine import aio
from engine.lora import read_lora
from engine.model import load_model
from engine.scheduler import Engine, EngineConfig
from engine.types import FinalEvent, GenerationRequest, SamplingParams

from .grammar_throughput import PROMPTS

MIXED = [(), (), (), (), (("a", 1.0),), (("a", 1.0),), (("b", 1.0),), (("b", 1.0),)]


def run(engine: Engine, prompts: list[list[int]], adapters: list,
        n_predict: int) -> tuple[float, float]:
    """(tokens per wall second, tokens per CPU second of this process)."""
    no_eos = [(t, None) for t in engine.vocab.eog_ids]
    requests = [GenerationRequest(tokens, SamplingParams(temperature=1.0, seed=i,
                                                         logit_bias=no_eos),
                                  n_predict=n_predict, cache_prompt=False, index=i,
                                  adapters=adapters[i])
                for i, tokens in enumerate(prompts)]

    async def collect() -> list[FinalEvent]:
        finals = []
        async for batch in aio.generate(engine, requests):
            finals += [e for e in batch if isinstance(e, FinalEvent)]
        return finals

    start, cpu = time.perf_counter(), time.process_time()
    finals = asyncio.run(collect())
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu
    assert all(f.n_predicted == n_predict for f in finals)
    n = sum(f.n_predicted for f in finals)
    return n / wall, n / cpu


def scenario(model: str, n_predict: int, repeats: int) -> dict:
    from tests.adapters import write_adapter

    config = EngineConfig(n_parallel=len(PROMPTS), n_ctx=n_predict + 64, n_batch=64)
    plain = Engine(load_model(model), config)
    adapted = Engine(load_model(model), config)
    plain.start()
    adapted.start()
    try:
        with tempfile.TemporaryDirectory() as folder:
            for seed, name in enumerate("ab"):
                path = write_adapter(Path(folder) / name, seed=seed)
                adapted.run_on_loop(lambda e, p=path, n=name: e.adapters.add(read_lora(p, n)))
        prompts = [plain.vocab.tokenize(p, add_special=True) for p in PROMPTS]
        base = [()] * len(prompts)
        runs = {"base_alone": (plain, base), "base_with_adapters_loaded": (adapted, base),
                "mixed": (adapted, MIXED)}
        for engine, adapters in runs.values():  # warm up
            run(engine, prompts, adapters, 8)
        best = {name: 0.0 for name in runs}
        per_cpu: dict[str, list[float]] = {name: [] for name in runs}
        names = list(runs)
        for r in range(repeats):  # each configuration first in turn: the load drifts over all
            for name in names[r % len(names):] + names[:r % len(names)]:
                engine, adapters = runs[name]
                wall, cpu = run(engine, prompts, adapters, n_predict)
                best[name] = max(best[name], wall)
                per_cpu[name].append(cpu)
    finally:
        plain.stop()
        adapted.stop()
    cpu_median = {k: sorted(v)[len(v) // 2] for k, v in per_cpu.items()}
    return {"sequences": len(prompts), "n_predict": n_predict, "repeats": repeats,
            "tokens_per_s": {k: round(v, 1) for k, v in best.items()},
            "tokens_per_cpu_s": {k: round(v, 1) for k, v in cpu_median.items()},
            "mixed_vs_base_alone": round(best["mixed"] / best["base_alone"], 3),
            "loaded_unused_vs_base_alone": round(
                best["base_with_adapters_loaded"] / best["base_alone"], 3),
            "cpu_mixed_vs_base_alone": round(cpu_median["mixed"] / cpu_median["base_alone"], 3),
            "cpu_loaded_unused_vs_base_alone": round(
                cpu_median["base_with_adapters_loaded"] / cpu_median["base_alone"], 3)}


def main(argv: list[str]) -> None:
    n_predict = int(argv[0]) if argv else 96
    repeats = int(argv[1]) if len(argv) > 1 else 3
    print(json.dumps(scenario("models/tiny-python", n_predict, repeats), indent=2))


if __name__ == "__main__":
    main(sys.argv[1:])
