"""A burst of prompts on the engine alone: ``concurrency`` requests submitted together, their
TTFT p50 and wall time, with prefill waves (engine/prefill_waves.py) and without, in alternating
rounds on one model; mlx-lm's BatchGenerator (every prompt in one prefill batch) beside them.

    python -m bench.burst [--model llama-27m] [--concurrency 16] [--tokens 8] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import os

from .engine_floor import run_engine, run_mlx_lm, start_engine
from .models import model_folder
from .ratios import percentile
from .workload import Workload, make_prompts


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.burst", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="llama-27m")
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--tokens", type=int, default=8)
    p.add_argument("--prompt-tokens", type=int, default=64)
    p.add_argument("--n-batch", type=int, default=512)
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args(argv)
    from deployments.api.config import GraphArgs
    from engine.model import load_model

    loaded = load_model(GraphArgs(model=model_folder(args.model)).model_path)
    c = args.concurrency
    prompts = make_prompts(loaded.vocab, c * (2 * args.rounds + 1), args.prompt_tokens)
    engines = {}
    for name, waves in (("engine, waves", True), ("engine, one batch", False)):
        engines[name] = start_engine(loaded, c, 2048, args.n_batch)
        engines[name].config.prefill_waves = waves
    results: dict[str, list] = {name: [] for name in [*engines, "mlx-lm BatchGenerator"]}
    walls: dict[str, float] = {name: 0.0 for name in results}
    try:
        warm = Workload(2, prompts[:c])
        for engine in engines.values():
            run_engine(engine, warm, c, c, lambda: None)
        for r in range(args.rounds):
            names = list(results) if r % 2 == 0 else list(results)[::-1]
            for i, name in enumerate(names):
                at = c * (1 + r * 2 + (i % 2))  # fresh prompts: no cache could help
                work = Workload(args.tokens, prompts[at:at + c])
                if name in engines:
                    got, wall = run_engine(engines[name], work, c, c, lambda: None)
                else:
                    got, wall = run_mlx_lm(loaded, work, c, c, c, args.n_batch, lambda: None)
                results[name] += [t.ttft * 1e3 for t in got]
                walls[name] += wall
    finally:
        for engine in engines.values():
            engine.stop()
    out = {name: {"ttft_ms_p50": round(percentile(v, 50), 1),
                  "ttft_ms_p99": round(percentile(v, 99), 1),
                  "wall_s_per_burst": round(walls[name] / args.rounds, 3)}
           for name, v in results.items()}
    print(json.dumps({"model": args.model, "concurrency": c, "tokens": args.tokens,
                      "prompt_tokens": args.prompt_tokens, "n_batch": args.n_batch,
                      "load_avg": [round(x, 2) for x in os.getloadavg()], "runs": out}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
