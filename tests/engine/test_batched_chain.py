"""Sampled sequences of the same settings drawn in one call (engine/batched_chain.py): the same
tokens as each sequence's own chain and sampler, seed for seed."""

from __future__ import annotations

import mlx.core as mx
import pytest

from engine.batched_chain import batched_draw, draw_rows
from engine.chain import chain_processor
from engine.penalties import logit_bias_processor
from engine.sampling import make_sampler
from engine.types import FinalEvent, GenerationRequest, SamplingParams, TokenEvent

from ..conftest import run_engine, running_engine

N_VOCAB, ROWS, STEPS = 300, 6, 12
SETTINGS = {
    "default chain": SamplingParams(temperature=0.8, top_k=40, top_p=0.95, min_p=0.05),
    "bias, typical, sigma": SamplingParams(temperature=1.3, typical_p=0.7, top_n_sigma=2.0,
                                           logit_bias=[(3, None), (5, 2.5)]),
    "dynatemp, min_keep": SamplingParams(temperature=0.9, dynatemp_range=0.5, min_keep=3,
                                         min_p=0.3, top_k=7),
    "temperature first": SamplingParams(temperature=0.7, top_k=4,
                                        samplers=["temperature", "top_k", "top_p"]),
    "fewer candidates than top_k": SamplingParams(temperature=0.8, top_k=40, top_p=0.9,
                                                  logit_bias=[(t, None) for t in range(280)]),
    "ties at the top_p cut": SamplingParams(temperature=1.0, top_k=30, top_p=0.5),
    "no temperature step": SamplingParams(temperature=0.0, top_k=9, samplers=["top_k"]),
}


def _own_chains(p: SamplingParams, logits: mx.array, seeds: list[int]) -> list[list[int]]:
    """Today's path: each row through its own processors and sampler, normalized as mlx-lm's
    batch does."""
    bias = logit_bias_processor(p.logit_bias, N_VOCAB) if p.logit_bias else None
    chains = [chain_processor(p, s, None, None) for s in seeds]
    samplers = [make_sampler(p, s, N_VOCAB) for s in seeds]
    out = []
    for step in logits:
        rows = []
        for e, chain in enumerate(chains):
            row = step[e : e + 1] if bias is None else bias(None, step[e : e + 1])
            rows.append(row if chain is None else chain(None, row))
        x = mx.concatenate(rows)
        lp = x - mx.logsumexp(x, axis=-1, keepdims=True)
        out.append(mx.concatenate([s(lp[e : e + 1]) for e, s in enumerate(samplers)]).tolist())
    return out


@pytest.mark.parametrize("name", list(SETTINGS))
@pytest.mark.parametrize("dtype", [mx.float32, mx.float16])
def test_one_call_draws_what_each_chain_draws(name, dtype):
    p = SETTINGS[name]
    logits = (mx.random.normal((STEPS, ROWS, N_VOCAB), key=mx.random.key(7)) * 4).astype(dtype)
    logits[:, :3, 10:20] = 9.0  # ties at the top, where top_p cuts
    logits[:, 3:, 20:70] = 5.0  # ties at the top_k cut, some past k
    seeds = [11, 12, 13, 0, 2**31, 99]
    want = _own_chains(p, logits, seeds)
    draw = batched_draw(p, N_VOCAB)
    rngs = [make_sampler(p, s, N_VOCAB).rng for s in seeds]
    got = [draw_rows(draw, step, rngs)[0].tolist() for step in logits]
    assert got == want


def test_shared_by_equal_settings_only():
    shared: dict = {}
    a = batched_draw(SamplingParams(temperature=0.8, top_k=40, seed=1), N_VOCAB, shared)
    assert a is batched_draw(SamplingParams(temperature=0.8, top_k=40, seed=2), N_VOCAB, shared)
    assert a is not batched_draw(SamplingParams(temperature=0.8, top_k=41), N_VOCAB, shared)


@pytest.mark.parametrize("own", [
    {"temperature": 0.0}, {"mirostat": 2}, {"n_probs": 2}, {"repeat_penalty": 1.2},
    {"dry_multiplier": 0.8}, {"xtc_probability": 0.5, "xtc_threshold": 0.1},
    {"samplers": ["top_k", "adaptive_p"]}, {"samplers": ["infill", "temperature"]},
])
def test_chains_with_their_own_state_are_not_batched(own):
    assert batched_draw(SamplingParams(**own), N_VOCAB) is None


@pytest.fixture(scope="module")
def engine():
    yield from running_engine(4)


def _tokens(engine, n_probs: int) -> dict[int, list[int]]:
    prompts = ["def main():\n", "import os\n", "class Foo:\n", "x = 1\n"]
    no_eos = [(t, None) for t in engine.vocab.eog_ids]
    requests = [GenerationRequest(engine.vocab.tokenize(text, add_special=True),
                                  SamplingParams(seed=40 + i, n_probs=n_probs, logit_bias=no_eos),
                                  n_predict=16, cache_prompt=False, index=i, stream=True)
                for i, text in enumerate(prompts)]
    events = run_engine(engine, *requests)
    assert sum(isinstance(e, FinalEvent) for e in events) == len(prompts)
    out: dict[int, list[int]] = {}
    for e in events:
        if isinstance(e, TokenEvent):
            out.setdefault(e.index, []).append(e.token)
    return out


def test_the_engine_draws_batched_as_each_chain_alone(engine):
    """The default chain, four seeded sequences in one batch (one batched draw a step) against
    the same with n_probs, which keeps each sequence on its own chain: the same tokens."""
    no_eos = [(t, None) for t in engine.vocab.eog_ids]
    assert batched_draw(SamplingParams(logit_bias=no_eos), engine.vocab.n_vocab) is not None
    batched = _tokens(engine, 0)
    assert batched == _tokens(engine, 1)
    assert len({tuple(t) for t in batched.values()}) == 4
