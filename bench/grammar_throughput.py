"""Aggregate decode throughput of 8 concurrent sequences with none, half or all constrained.

    python bench/grammar_throughput.py [N_PREDICT] [REPEATS]

Engine level (no HTTP): every configuration runs REPEATS times round-robin, so drift in the
machine's load hits each alike, and the best run is reported (docs/grammar.md). The lazy_*
configurations wait for a trigger that never fires: their cost before a trigger.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time

from engine import aio
from engine.grammar import json_schema_grammar
from engine.model import load_model
from engine.scheduler import Engine, EngineConfig
from engine.types import (
    TRIGGER_PATTERN_FULL,
    TRIGGER_WORD,
    FinalEvent,
    GenerationRequest,
    GrammarTrigger,
    SamplingParams,
)

PROMPTS = ["def main():\n", "import os\n", "class Foo:\n    def __init__(self",
           "    for i in range(", "x = 1\n", "def f(a, b):\n", "# comment\n", "for k in d:\n"]
# grammars that cannot end before N_PREDICT, so every sequence decodes the whole time
GRAMMARS = {
    "gbnf_chars": "root ::= [a-zA-Z0-9 _,.:()=\\n]{600}",
    "json_array": json_schema_grammar({"type": "array", "items": {"type": "integer"},
                                       "minItems": 200, "maxItems": 200}),
}

LAZY_WAITING = {
    "words": [GrammarTrigger(TRIGGER_WORD, "<tool_call>"), GrammarTrigger(TRIGGER_WORD, "@@@")],
    "pattern_full": [GrammarTrigger(TRIGGER_PATTERN_FULL, r"[\s\S]*?(<tool_call>)[\s\S]*")],
}


def run(engine: Engine, prompts: list[list[int]], grammar: str, n_constrained: int,
        n_predict: int, triggers: list[GrammarTrigger] | None = None) -> float:
    """Decode tokens/s; with ``triggers`` the constrained sequences are lazy."""
    no_eos = [(t, None) for t in engine.vocab.eog_ids]  # every sequence runs n_predict tokens
    requests = [GenerationRequest(tokens, SamplingParams(temperature=1.0, seed=i,
                                                         logit_bias=no_eos),
                                  n_predict=n_predict, cache_prompt=False, index=i,
                                  grammar=grammar if i < n_constrained else "",
                                  grammar_lazy=triggers is not None,
                                  grammar_triggers=triggers or [])
                for i, tokens in enumerate(prompts)]

    async def collect() -> list[FinalEvent]:
        finals = []
        async for batch in aio.generate(engine, requests):
            finals += [e for e in batch if isinstance(e, FinalEvent)]
        return finals

    start = time.perf_counter()
    finals = asyncio.run(collect())
    wall = time.perf_counter() - start
    assert all(f.n_predicted == n_predict for f in finals)
    return sum(f.n_predicted for f in finals) / wall


def scenario(engine: Engine, n_predict: int, repeats: int) -> dict:
    """The benchmark's grammar scenario: 8 sequences in one batch, free against half of them
    constrained by a GBNF grammar, alternating runs, best of each (python -m bench)."""
    prompts = [engine.vocab.tokenize(p, add_special=True) for p in PROMPTS]
    grammar = GRAMMARS["gbnf_chars"]
    run(engine, prompts, grammar, 4, 8)  # compile the grammar, warm up
    free, half = [], []
    for _ in range(repeats):
        free.append(run(engine, prompts, "", 0, n_predict))
        half.append(run(engine, prompts, grammar, 4, n_predict))
    return {"sequences": len(prompts), "constrained": 4, "n_predict": n_predict,
            "grammar": grammar, "free_tokens_per_s": round(max(free), 2),
            "half_constrained_tokens_per_s": round(max(half), 2),
            "ratio": round(max(half) / max(free), 3)}


def main() -> None:
    n_predict = int(sys.argv[1]) if len(sys.argv) > 1 else 96
    repeats = int(sys.argv[2]) if len(sys.argv) > 2 else 5
    engine = Engine(load_model("models/tiny-python"),
                    EngineConfig(n_parallel=8, n_ctx=1024, n_batch=64))
    engine.start()
    prompts = [engine.vocab.tokenize(p, add_special=True) for p in PROMPTS]
    configs = {"none": ("", 0, None)}
    configs.update({f"{name}_half": (g, 4, None) for name, g in GRAMMARS.items()})
    configs.update({f"{name}_all": (g, 8, None) for name, g in GRAMMARS.items()})
    # lazy grammars waiting for a trigger that never comes: the scanner's cost alone
    configs.update({f"lazy_{name}_all": (GRAMMARS["gbnf_chars"], 8, triggers)
                    for name, triggers in LAZY_WAITING.items()})
    for grammar, n, triggers in configs.values():  # warm up and compile
        run(engine, prompts, grammar, n, 8, triggers)
    rates: dict[str, list[float]] = {label: [] for label in configs}
    for _ in range(repeats):
        for label, (grammar, n, triggers) in configs.items():
            rates[label].append(run(engine, prompts, grammar, n, n_predict, triggers))
    base = max(rates["none"])
    print(json.dumps({label: {"tok_per_s": round(max(r), 1), "ratio": round(max(r) / base, 3)}
                      for label, r in rates.items()}, indent=1))
    engine.stop()


if __name__ == "__main__":
    main()
