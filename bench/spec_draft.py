"""Speculative decoding with a draft model against plain decoding.

``python -m bench.spec_draft`` drives mlxray's ``Engine`` (no Ray). The pair: the embedded model
drafts for a deep target built at bench time (tests/draft_models.py's ``build_deep_target``: the
embedded model with ``--extra-layers`` more layers whose outputs are scaled down, so it costs what
a deep model costs per token and mostly chooses the embedded model's tokens; not a trained model).
Plain prompts (the bench's workload openings) are decoded for ``--tokens`` tokens by one
sequence, greedy and with llama-server's default sampled chain (seeded), with ``-md`` and
without. Prints ``spec_draft_vs_plain@1`` (greedy) and ``spec_draft_vs_plain_sampled@1``
(wall-clock tokens per second, speculative over plain, the best of ``--rounds`` after a warm-up
round) with the acceptance rates."""

from __future__ import annotations

import argparse
import tempfile
import time
from dataclasses import replace
from pathlib import Path

from engine.model import load_model
from engine.scheduler import Engine, EngineConfig
from engine.types import FinalEvent, GenerationRequest, SamplingParams
from tests.conftest import MODEL, run_engine
from tests.draft_models import build_deep_target

PROMPTS = ["def main():\n", "import os\nimport sys\n\n", "class Parser:\n    def __init__(self",
           "for i in range(10):\n"]
SAMPLED = {"temperature": 0.8, "top_k": 40, "top_p": 0.95, "min_p": 0.05, "seed": 1}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.spec_draft", description=__doc__)
    p.add_argument("--tokens", type=int, default=128)
    p.add_argument("--extra-layers", type=int, default=22)
    p.add_argument("--scale", type=float, default=0.1,
                   help="the extra layers' output scale: larger, the target agrees less")
    p.add_argument("--n-max", type=int, default=8)
    p.add_argument("--rounds", type=int, default=2)
    return p.parse_args(argv)


def run(engine: Engine, tokens: int, sampling: dict) -> float:
    """Tokens per second of the prompts decoded one after the other."""
    made, took = 0, 0.0
    for prompt in PROMPTS:
        request = GenerationRequest(engine.vocab.tokenize(prompt, add_special=True),
                                    SamplingParams(**sampling), n_predict=tokens,
                                    cache_prompt=False)
        t = time.perf_counter()
        made += sum(e.n_predicted for e in run_engine(engine, request)
                    if isinstance(e, FinalEvent))
        took += time.perf_counter() - t
    return made / took


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    with tempfile.TemporaryDirectory() as folder:
        target = load_model(str(build_deep_target(Path(folder), args.extra_layers, args.scale)))
    draft = load_model(MODEL)
    for name, sampling in (("", {"temperature": 0.0}), ("_sampled", SAMPLED)):
        best: dict[str, float] = {}
        for spec in ["none", "draft-simple"]:
            engine = Engine(target, EngineConfig(n_parallel=1, n_ctx=2048, spec_type=spec,
                                                 spec_draft_n_max=args.n_max),
                            draft if spec != "none" else None)
            engine.start()
            try:
                run(engine, args.tokens, sampling)  # the warm-up a running server has had
                before = replace(engine.metrics.spec)
                best[spec] = max(run(engine, args.tokens, sampling) for _ in range(args.rounds))
                counters = engine.metrics.spec
            finally:
                engine.stop()
        drafted = counters.draft_tokens - before.draft_tokens
        acceptance = (counters.accepted - before.accepted) / max(1, drafted)
        print(f"spec_draft_vs_plain{name}@1 {best['draft-simple'] / best['none']:.2f} "
              f"(plain {best['none']:.1f} tok/s, spec {best['draft-simple']:.1f} tok/s, "
              f"acceptance {acceptance:.2f} of {drafted} drafted after the warm-up)",
              flush=True)


if __name__ == "__main__":
    main()
