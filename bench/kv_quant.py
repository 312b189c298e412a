"""The KV cache types at a long context: memory of the cache and decode speed, per -ctk.

``python -m bench.kv_quant`` drives mlxray's ``Engine`` (no Ray) on the embedded model: for the
model in float32 and cast to float16, and for each cache type (the unquantized one in the model's
dtype, q8_0, q4_0), ``--batch`` sequences each read a ``--context``-token prompt (the repository's
source) and decode ``--tokens`` tokens greedily. Memory is the bytes of one sequence's cache as the
prefix cache stores it (prompt and answer, no spare capacity); decode speed is the engine's own
``predicted_per_second`` summed over the batch, the best of ``--rounds`` runs (alternating
order), to keep the neighbours' load out of it. Prints one markdown table row per type.
"""

from __future__ import annotations

import argparse
import asyncio
import time

import mlx.core as mx

from engine import aio
from engine.model import LoadedModel, load_model
from engine.scheduler import Engine, EngineConfig
from engine.types import ErrorEvent, FinalEvent, GenerationRequest, SamplingParams

from .workload import corpus_tokens

MIB = 1024 * 1024


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.kv_quant", description=__doc__)
    p.add_argument("--model", default="models/tiny-python")
    p.add_argument("--context", type=int, default=8192, help="prompt tokens (default 8192)")
    p.add_argument("--tokens", type=int, default=64, help="decoded tokens (default 64)")
    p.add_argument("--batch", type=int, default=1, help="sequences decoded together")
    p.add_argument("--n-batch", type=int, default=512, help="prefill chunk (default 512)")
    p.add_argument("--dtypes", default="f32,f16", help="model dtypes (default f32,f16)")
    p.add_argument("--rounds", type=int, default=1,
                   help="runs of each cache type, in alternating order; the fastest is kept")
    return p.parse_args(argv)


def prompts_of(loaded: LoadedModel, n: int, count: int) -> list[list[int]]:
    """``count`` prompts of ``n``, ``n + 1``, ... tokens of the repository's source."""
    corpus = corpus_tokens(loaded.vocab)
    while len(corpus) < n + count:
        corpus = corpus + corpus
    return [corpus[i: i + n + i] for i in range(count)]


def measure(loaded: LoadedModel, cache_type: str, args: argparse.Namespace) -> dict:
    n_ctx = args.context + args.tokens + 8
    engine = Engine(loaded, EngineConfig(n_parallel=args.batch, n_ctx=n_ctx,
                                         n_batch=args.n_batch, kv_cache_type=cache_type))
    engine.start()
    try:
        prompts = prompts_of(loaded, args.context, args.batch)
        requests = [GenerationRequest(p, SamplingParams(temperature=0.0), n_predict=args.tokens,
                                      ignore_eos=True, index=i) for i, p in enumerate(prompts)]
        start = time.perf_counter()
        finals = asyncio.run(_finals(engine, requests))
        wall = time.perf_counter() - start
        cache, n_tokens = engine.run_on_loop(lambda e: e.prefix_cache.longest(
            prompts[0] + finals[0].tokens))
        nbytes = sum(c.nbytes for c in cache)
    finally:
        engine.stop()
    decode = sum(f.timings.predicted_n / (f.timings.predicted_ms / 1e3) for f in finals)
    prefill = sum(f.timings.prompt_n for f in finals) / max(
        f.timings.prompt_ms / 1e3 for f in finals)
    return {"cache": cache_type, "bytes": nbytes, "n_tokens": n_tokens, "decode": decode,
            "prefill": prefill, "wall": wall}


async def _finals(engine: Engine, requests: list[GenerationRequest]) -> list[FinalEvent]:
    out: dict[int, FinalEvent] = {}
    async for batch in aio.generate(engine, requests):
        for event in batch:
            if isinstance(event, ErrorEvent):
                raise RuntimeError(event)
        out.update({e.index: e for e in batch if isinstance(e, FinalEvent)})
    return [out[i] for i in range(len(requests))]


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    print(f"device: {mx.default_device()}, context {args.context}, batch {args.batch}, "
          f"{args.tokens} tokens decoded")
    print("| model dtype | -ctk/-ctv | cache of one sequence | per token | vs unquantized "
          "| decode tok/s | prefill tok/s |")
    print("|---|---|---|---|---|---|---|")
    for plain in args.dtypes.split(","):
        dtype = {"f32": mx.float32, "f16": mx.float16, "bf16": mx.bfloat16}[plain]
        loaded = load_model(args.model)
        loaded.model.set_dtype(dtype)
        mx.eval(loaded.model.parameters())  # here: the engine thread has no stream of ours
        types = [plain, "q8_0", "q4_0"]
        best: dict[str, dict] = {}
        for round_ in range(args.rounds):
            for cache_type in types if round_ % 2 == 0 else types[::-1]:
                r = measure(loaded, cache_type, args)
                if cache_type not in best or r["decode"] > best[cache_type]["decode"]:
                    best[cache_type] = r
        for cache_type in types:
            print(_row(plain, best[cache_type], best[plain]), flush=True)


def _row(dtype: str, r: dict, base: dict) -> str:
    return (f"| {dtype} | {r['cache']} | {r['bytes'] / MIB:.2f} MiB ({r['n_tokens']} tokens) "
            f"| {r['bytes'] / r['n_tokens']:.0f} B | {r['bytes'] / base['bytes']:.2f}x "
            f"| {r['decode']:.1f} ({r['decode'] / base['decode']:.2f}x) | {r['prefill']:.0f} |")

if __name__ == "__main__":
    main()
