"""N-gram speculative decoding against plain decoding, on a repetition workload.

``python -m bench.spec_ngram`` drives mlxray's ``Engine`` (no Ray) on the embedded model: the
prompt is code to rewrite, given in the prompt (a block of bench/rewrite_source.txt, the
repository's engine/speculative.py as it was when this bench was written, twice, and the start of
it a third time), decoded greedily for ``--tokens`` tokens by 1 and by ``--streams`` sequences at
once, with ``--spec-type ngram-simple`` and without. Prints ``spec_ngram_vs_plain@N`` (wall-clock
tokens per second, speculative over plain, the best of ``--rounds`` after a warm-up round) and
the acceptance rate (accepted over drafted tokens). Then the cost of turning it on where nothing
repeats: ``spec_ngram_on_plain@N`` and ``spec_ngram_on_plain_sampled@N``, the same ratio on short
openings of code decoded by ``--streams`` sequences, greedy and with llama-server's default
sampled chain (seeded)."""

from __future__ import annotations

import argparse
import time
from dataclasses import replace
from pathlib import Path

from engine.model import load_model
from engine.scheduler import Engine, EngineConfig
from engine.types import FinalEvent, GenerationRequest, SamplingParams
from tests.conftest import run_engine


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.spec_ngram", description=__doc__)
    p.add_argument("--model", default="models/tiny-python")
    p.add_argument("--tokens", type=int, default=128)
    p.add_argument("--streams", type=int, default=16)
    p.add_argument("--size-n", type=int, default=12)
    p.add_argument("--size-m", type=int, default=48)
    p.add_argument("--rounds", type=int, default=2)
    return p.parse_args(argv)


def rewrite_prompt(i: int) -> str:
    source = (Path(__file__).parent / "rewrite_source.txt").read_text().splitlines()
    block = "\n".join(source[20 + 7 * i:44 + 7 * i]) + "\n"
    return block + "\n" + block + "\n" + block[: len(block) // 3]


OPENINGS = ["def main():\n", "import os\nimport sys\n\n", "class Parser:\n",
            "for i in range(10):\n", "    return ", "if __name__ == ", "x = [", "try:\n"]
SAMPLED = {"temperature": 0.8, "top_k": 40, "top_p": 0.95, "min_p": 0.05}


def run(engine: Engine, n: int, tokens: int, prompt=rewrite_prompt,
        sampling: dict | None = None) -> tuple[float, int]:
    requests = [GenerationRequest(engine.vocab.tokenize(prompt(i), add_special=True),
                                  SamplingParams(**(sampling or {"temperature": 0.0}),
                                                 seed=i), n_predict=tokens,
                                  cache_prompt=False, index=i) for i in range(n)]
    t = time.perf_counter()
    done = [e for e in run_engine(engine, *requests) if isinstance(e, FinalEvent)]
    return sum(f.n_predicted for f in done) / (time.perf_counter() - t), len(done)


def compare(loaded, args, n: int, name: str, **workload) -> None:
    """Speculative over plain throughput at ``n`` streams: each engine serves the workload once
    to warm up (as a running server has: the pacer's measurements, MLX's compiled kernels),
    then ``--rounds`` times, its best counted."""
    best: dict[str, float] = {}
    for spec in ["none", "ngram-simple"]:
        engine = Engine(loaded, EngineConfig(n_parallel=n, n_ctx=2048, n_batch=512,
                                             spec_type=spec, spec_ngram_size_n=args.size_n,
                                             spec_ngram_size_m=args.size_m))
        engine.start()
        try:
            run(engine, n, args.tokens, **workload)
            before = replace(engine.metrics.spec)
            best[spec] = max(run(engine, n, args.tokens, **workload)[0]
                             for _ in range(args.rounds))
            counters = engine.metrics.spec
        finally:
            engine.stop()
    drafted = counters.draft_tokens - before.draft_tokens
    acceptance = (counters.accepted - before.accepted) / max(1, drafted)
    print(f"{name}@{n} {best['ngram-simple'] / best['none']:.2f} "
          f"(plain {best['none']:.1f} tok/s, spec {best['ngram-simple']:.1f} tok/s, "
          f"acceptance {acceptance:.2f} of {drafted} drafted after the warm-up)", flush=True)


def opening(i: int) -> str:
    return OPENINGS[i % len(OPENINGS)]


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    loaded = load_model(args.model)
    for n in (1, args.streams):
        compare(loaded, args, n, "spec_ngram_vs_plain")
    compare(loaded, args, args.streams, "spec_ngram_on_plain", prompt=opening)
    compare(loaded, args, args.streams, "spec_ngram_on_plain_sampled", prompt=opening,
            sampling=SAMPLED)


if __name__ == "__main__":
    main()
