"""Masks per second of the grammar engines on a model's vocabulary (docs/grammar.md).

    python bench/grammar_masks.py [MODEL]

Each grammar gets one matcher walked through random allowed tokens; the mask fill plus the numpy
unpack are timed in thread CPU time (a loaded machine's preemption does not count). xgrammar is
tried too and reported as failed when it does not import.
"""

from __future__ import annotations

import json
import random
import sys
import time
from collections.abc import Callable

import numpy as np
from transformers import AutoTokenizer

SCHEMA = {"type": "object", "properties": {"n": {"type": "integer"}, "name": {"type": "string"},
          "tags": {"type": "array", "items": {"type": "string"}}}, "required": ["n"]}
GBNF = {"gbnf_yes_no": 'root ::= "yes" | "no"',
        "gbnf_lines": 'root ::= line+\nline ::= [a-z ]+ "\\n"'}
STEPS = 3000


def walk(fresh: Callable, fill: Callable, consume: Callable, eos: int, max_len: int = 64) -> float:
    rng = random.Random(0)
    matcher, n, spent, masks = fresh(), 0, 0.0, 0
    while masks < STEPS:
        start = time.thread_time()
        allowed = np.flatnonzero(fill(matcher))
        spent += time.thread_time() - start
        masks += 1
        choice = int(rng.choice(allowed.tolist())) if len(allowed) else eos
        if choice == eos or n >= max_len or (eos in allowed and rng.random() < 0.3):
            matcher, n = fresh(), 0
            continue
        consume(matcher, choice)
        n += 1
    return masks / spent


def unpack(bits: np.ndarray, n_vocab: int) -> np.ndarray:
    return np.unpackbits(bits.view(np.uint8), bitorder="little")[:n_vocab]


def bench_llguidance(tok, n_vocab: int) -> dict:
    import llguidance
    import llguidance.hf
    from llguidance.gbnf_to_lark import gbnf_to_lark

    lltok = llguidance.hf.from_tokenizer(tok, n_vocab=n_vocab)
    grammars = {"json_schema": llguidance.LLMatcher.grammar_from_json_schema(SCHEMA)}
    grammars.update({k: llguidance.LLMatcher.grammar_from_lark(gbnf_to_lark(v))
                     for k, v in GBNF.items()})
    bits = np.zeros((n_vocab + 31) // 32, dtype=np.int32)

    def fill(m):
        m.unsafe_compute_mask_ptr(bits.ctypes.data, bits.nbytes)
        return unpack(bits, n_vocab)

    out = {}
    for name, grammar in grammars.items():
        start = time.perf_counter()
        template = llguidance.LLMatcher(lltok, grammar, log_level=0)
        compile_ms = (time.perf_counter() - start) * 1e3
        rate = walk(template.deep_copy, fill, lambda m, t: m.consume_token(t), tok.eos_token_id)
        out[name] = {"compile_ms": round(compile_ms, 2), "masks_per_s": round(rate)}
    return out


def bench_xgrammar(tok, n_vocab: int) -> dict:
    import xgrammar as xgr

    compiler = xgr.GrammarCompiler(xgr.TokenizerInfo.from_huggingface(tok, vocab_size=n_vocab))
    grammars = {"json_schema": lambda: compiler.compile_json_schema(json.dumps(SCHEMA))}
    grammars.update({k: (lambda v=v: compiler.compile_grammar(v)) for k, v in GBNF.items()})
    bits = np.zeros((1, (n_vocab + 31) // 32), dtype=np.int32)

    def fill(m):
        m.fill_next_token_bitmask(bits, 0)
        return unpack(bits[0], n_vocab)

    out = {}
    for name, make in grammars.items():
        start = time.perf_counter()
        compiled = make()
        compile_ms = (time.perf_counter() - start) * 1e3
        rate = walk(lambda c=compiled: xgr.GrammarMatcher(c), fill,
                    lambda m, t: m.accept_token(t), tok.eos_token_id)
        out[name] = {"compile_ms": round(compile_ms, 2), "masks_per_s": round(rate)}
    return out


def main() -> None:
    model = sys.argv[1] if len(sys.argv) > 1 else "models/tiny-python"
    tok = AutoTokenizer.from_pretrained(model)
    print("vocab", len(tok))
    for name, bench in (("llguidance", bench_llguidance), ("xgrammar", bench_xgrammar)):
        try:
            print(name, json.dumps(bench(tok, len(tok))))
        except Exception as exc:  # noqa: BLE001 - report and go on to the next engine
            print(name, "FAILED:", type(exc).__name__, str(exc)[:300])


if __name__ == "__main__":
    main()
