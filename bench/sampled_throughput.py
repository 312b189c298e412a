"""The sampled scenario: llama-server's default chain (temperature 0.8, top_k 40, top_p 0.95,
min_p 0.05) against greedy, 16 requests in flight, both engines driven directly.

    python -m bench.sampled_throughput [MODEL] [N_TOKENS] [ROUNDS]

Three runs take turns each round, in alternating order: mlxray's engine greedy, the same engine
with the default chain (seeded per request), mlx-lm's ``BatchGenerator`` with
``make_sampler`` on the same settings; the figures are the medians over the rounds.
"""

from __future__ import annotations

import json
import statistics
import sys
from dataclasses import dataclass

from mlx_lm.sample_utils import make_sampler

from deployments.api.config import GraphArgs
from engine.model import LoadedModel, load_model
from engine.scheduler import Engine

from . import engine_floor
from .models import model_folder
from .ratios import summarize
from .workload import Workload, make_prompts

# llama-server's defaults for a request that names no sampler setting
DEFAULT_CHAIN = {"temperature": 0.8, "top_k": 40, "top_p": 0.95, "min_p": 0.05}
CONCURRENCY = 16
TARGETS = {"sampled_vs_greedy_engine@16": 0.85, "engine_vs_mlx_lm_sampled@16": 1.2}


@dataclass(frozen=True)
class SampledWorkload(Workload):
    """The default chain instead of greedy, one seed per request (reproducible draws)."""

    def body(self, i: int, stream: bool = True, cache_prompt: bool = False) -> dict:
        return {**super().body(i, stream, cache_prompt), **DEFAULT_CHAIN, "seed": i}


def mlx_lm_sampler():
    return make_sampler(temp=DEFAULT_CHAIN["temperature"], top_p=DEFAULT_CHAIN["top_p"],
                        min_p=DEFAULT_CHAIN["min_p"], top_k=DEFAULT_CHAIN["top_k"])


def scenario(engine: Engine, loaded: LoadedModel, n_tokens: int, rounds: int,
             prompt_tokens: int = 64, n_batch: int = 512) -> dict:
    """Tokens/s of the three runs (medians over ``rounds``) and the issue's two ratios."""
    n = CONCURRENCY
    prompts = make_prompts(loaded.vocab, n * rounds, prompt_tokens, stride=prompt_tokens + 7)
    runners = {
        "engine_greedy": lambda w: engine_floor.run_engine(engine, w, n, n, _nothing),
        "engine_sampled": lambda w: engine_floor.run_engine(
            engine, SampledWorkload(w.n_tokens, w.prompts), n, n, _nothing),
        "mlx_lm_sampled": lambda w: engine_floor.run_mlx_lm(
            loaded, w, n, n, engine.config.n_parallel, n_batch, _nothing, mlx_lm_sampler()),
    }
    for run in runners.values():  # warm-up: compiles and caches
        run(Workload(8, prompts[:n]))
    rates: dict[str, list[float]] = {name: [] for name in runners}
    for r in range(rounds):
        work = Workload(n_tokens, prompts[r * n:] + prompts[:r * n])
        order = list(runners) if r % 2 == 0 else list(runners)[::-1]
        for name in order:
            timings, wall = runners[name](work)
            rates[name].append(summarize(timings, wall)["tokens_per_s"])
    median = {name: statistics.median(values) for name, values in rates.items()}
    return {"concurrency": n, "n_tokens": n_tokens, "rounds": rounds, "chain": DEFAULT_CHAIN,
            "tokens_per_s": {k: [round(v, 1) for v in vs] for k, vs in rates.items()},
            "median_tokens_per_s": {k: round(v, 1) for k, v in median.items()},
            "ratios": {
                "sampled_vs_greedy_engine@16": round(
                    median["engine_sampled"] / median["engine_greedy"], 3),
                "engine_vs_mlx_lm_sampled@16": round(
                    median["engine_sampled"] / median["mlx_lm_sampled"], 3)}}


def ratio_lines(result: dict) -> list[str]:
    return [f"(sampled scenario) {name} {value:.3f} (target >= {TARGETS[name]:g}: "
            f"{'ok' if value >= TARGETS[name] else 'MISSED'})"
            for name, value in result["ratios"].items()]


def _nothing() -> None:
    return None


def main() -> None:
    model = sys.argv[1] if len(sys.argv) > 1 else "models/tiny-python"
    n_tokens = int(sys.argv[2]) if len(sys.argv) > 2 else 128
    rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 3
    loaded = load_model(GraphArgs(model=model_folder(model)).model_path)
    engine = engine_floor.start_engine(loaded, CONCURRENCY, 2048, 512)
    try:
        result = scenario(engine, loaded, n_tokens, rounds)
    finally:
        engine.stop()
    print(json.dumps(result, indent=1))
    for line in ratio_lines(result):
        print(line)


if __name__ == "__main__":
    main()
