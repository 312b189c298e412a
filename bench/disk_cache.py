"""The disk prompt cache (issue #37), on the engine alone: a 4,000-token prompt read cold, then by
a restarted engine on the same --cache-disk folder (warm from disk), and a RAM hit with and
without the disk tier. Prints disk_warm_vs_cold_ttft (target <= 0.25) and ram_hit_ttft_ratio
(with / without the tier; target 1 +- 0.05).

    .venv/bin/python -m bench.disk_cache [--tokens 4000] [--model models/tiny-python]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

from engine.model import load_model
from engine.scheduler import Engine, EngineConfig
from engine.types import FinalEvent, GenerationRequest, SamplingParams
from tests.conftest import run_engine


def ttft(engine: Engine, prompt: list[int]) -> tuple[float, int]:
    """Seconds to the first (only) token, and the prompt tokens taken from a cache."""
    req = GenerationRequest(prompt, SamplingParams(temperature=0.0), n_predict=1)
    start = time.perf_counter()
    final = next(e for e in run_engine(engine, req) if isinstance(e, FinalEvent))
    return time.perf_counter() - start, final.timings.cache_n


def engine(model: str, n_ctx: int, folder: str | None) -> Engine:
    eng = Engine(load_model(model), EngineConfig(n_parallel=1, n_ctx=n_ctx, n_batch=512,
                                                 cache_disk=folder))
    eng.start()
    return eng


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="models/tiny-python")
    ap.add_argument("--tokens", type=int, default=4000)
    ap.add_argument("--repeats", type=int, default=5)
    a = ap.parse_args()
    n_ctx = a.tokens + 64
    with tempfile.TemporaryDirectory() as folder:
        first = engine(a.model, n_ctx, folder)
        text = "".join(f"value_{i} = compute({i}, scale={i % 7})\n" for i in range(a.tokens))
        prompt = first.vocab.tokenize(text, add_special=True)[: a.tokens]
        ttft(first, prompt[:64])  # warm up the kernels
        cold, _ = ttft(first, prompt)
        first.stop()  # the restart: the writer has finished
        restarted = engine(a.model, n_ctx, folder)
        ttft(restarted, prompt[:64])
        warm, from_disk = ttft(restarted, prompt)
        ram_disk = statistics.median(ttft(restarted, prompt)[0] for _ in range(a.repeats))
        restarted.stop()
    plain = engine(a.model, n_ctx, None)
    ttft(plain, prompt)
    ram_plain = statistics.median(ttft(plain, prompt)[0] for _ in range(a.repeats))
    plain.stop()
    print(f"prompt_tokens {len(prompt)} cold_ttft_s {cold:.4f} disk_warm_ttft_s {warm:.4f} "
          f"(cache_n {from_disk})")
    print(f"disk_warm_vs_cold_ttft {warm / cold:.3f}")
    print(f"ram_hit_ttft_s with_disk {ram_disk:.4f} without {ram_plain:.4f} "
          f"ram_hit_ttft_ratio {ram_disk / ram_plain:.3f}")


if __name__ == "__main__":
    main()
