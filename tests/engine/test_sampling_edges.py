"""The sampler chain with its numbers at the edges of their domains (the schema's float32 values
of tests/edges.py's EDGES, infinities included): no step produces a NaN, a banned token is never
drawn, the probabilities reported after sampling are finite. No model, no Ray: crafted logits
through the bias, the chain processor and the sampler, as the engine runs them (mlx-lm
normalizes the processed logits before the sampler)."""

from __future__ import annotations

from dataclasses import replace

import mlx.core as mx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.chain import chain_processor
from engine.checks import sampler_init_error
from engine.numerics import FLT_MAX, scale
from engine.penalties import make_processors
from engine.sampling import make_sampler
from engine.types import DEFAULT_SAMPLERS, SamplingParams

from ..edge_oracle import f32
from ..edges import EDGES

N_VOCAB = 16
BANNED = (3, 4, 5)
LOGITS = mx.array([[float(i % 5) - 2.0 for i in range(N_VOCAB)]])
# repeats (penalties and DRY act); seen tokens with logits below, at and above zero
CONTEXT = mx.array([1, 2, 2, 6, 6, 6, 7, 1, 2, 2, 6, 9])

FLOAT_FIELDS = ("temperature", "dynatemp_range", "dynatemp_exponent", "top_p", "min_p",
                "top_n_sigma", "typical_p", "xtc_probability", "xtc_threshold",
                "repeat_penalty", "frequency_penalty", "presence_penalty", "dry_multiplier",
                "dry_base", "mirostat_tau", "mirostat_eta", "adaptive_target", "adaptive_decay")
# what the schema lets through: soft limits clamp, adaptive_decay's hard one refuses
CLAMPS = {"top_p": (0.0, 1.0), "min_p": (0.0, 1.0), "xtc_probability": (0.0, 1.0),
          "xtc_threshold": (0.0, 1.0), "temperature": (0.0, float("inf")),
          "adaptive_target": (-FLT_MAX, 1.0), "adaptive_decay": (0.0, 0.99)}
EDGE_FLOATS = sorted({f32(v) for v in EDGES} | {FLT_MAX, -FLT_MAX, 1e-38})


def clamp(name: str, value: float) -> float:
    lo, hi = CLAMPS.get(name, (-float("inf"), float("inf")))
    return min(max(value, lo), hi)


params = st.builds(
    lambda values, mirostat, samplers, min_keep: SamplingParams(
        **{name: clamp(name, v) for name, v in values.items()}, mirostat=mirostat,
        samplers=samplers, min_keep=min_keep, top_k=0, dry_sequence_breakers=["@"],
        logit_bias=[(t, None) for t in BANNED], seed=1),
    values=st.dictionaries(st.sampled_from(FLOAT_FIELDS), st.sampled_from(EDGE_FLOATS),
                           min_size=1, max_size=4),
    mirostat=st.sampled_from([0, 0, 1, 2]),
    samplers=st.sampled_from([list(DEFAULT_SAMPLERS), ["top_k", "adaptive_p"],
                              ["temperature", "top_n_sigma", "min_p", "typ_p", "xtc"],
                              ["dry", "penalties", "temperature", "adaptive_p"]]),
    min_keep=st.sampled_from([0, 1, 2**31 - 1]),
)


def run_chain(p: SamplingParams, steps: int = 3) -> list[tuple[int, mx.array | None]]:
    """Tokens drawn and the probabilities recorded with them, step by step: the engine's
    processors (the bias, then the chain) and its sampler (engine/admission.py's _chain)."""
    recorded: list[mx.array] = []
    processors = make_processors(p, N_VOCAB)
    chain = chain_processor(p, 1, {}, None)
    processors += [chain] if chain is not None else []
    sample = make_sampler(p, 1, N_VOCAB, record=recorded.append)
    out = []
    for _ in range(steps):
        logits = LOGITS
        for processor in processors:
            logits = processor(CONTEXT, logits)
        logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
        assert not mx.any(mx.isnan(logprobs)).item(), p
        token = sample(logprobs).item()
        out.append((token, recorded[-1] if recorded else None))
    return out


@settings(max_examples=400, deadline=None, derandomize=True, database=None,
          suppress_health_check=list(HealthCheck))
@given(p=params, greedy=st.booleans())
def test_no_nan_and_no_banned_token_at_any_edge(p, greedy):
    if greedy:
        p = replace(p, temperature=0.0)
    if sampler_init_error(p) is not None:
        return  # refused before any sampling (the penalties' init checks)
    for token, probs in run_chain(p):
        assert token not in BANNED, p
        if probs is not None:
            assert not mx.any(mx.isnan(probs)).item(), p
            assert mx.all((probs >= 0) & (probs <= 1)).item(), p


@pytest.mark.parametrize(("changes", "allowed"), [
    ({"temperature": float("inf")}, None),  # every candidate equal: none banned
    ({"temperature": 1e-38}, {9, 14}),  # the best logit (2.0) only, without an overflow
    # 2.0 / 3e-39 overflows: token 9 is certain (its reciprocal is finite: not refused)
    ({"repeat_penalty": f32(3e-39), "samplers": ["penalties", "temperature"]}, {9}),
    # -2 x -3e38 overflows: the tokens seen twice or more are certain
    ({"frequency_penalty": -3e38, "samplers": ["penalties", "temperature"]}, {1, 2, 6}),
    ({"dry_multiplier": float("-inf"), "dry_base": 1.75}, None),
    ({"dynatemp_range": float("inf")}, None),
    ({"mirostat": 2, "mirostat_tau": float("inf"), "mirostat_eta": 0.0}, None),
])
def test_edges_that_used_to_give_nan(changes, allowed):
    """Each of these made a NaN before (inf / inf, -inf - -inf, 0 * inf, an overflow to +inf):
    the draw then took any token, a banned one included."""
    p = replace(SamplingParams(top_k=0, seed=1, logit_bias=[(t, None) for t in BANNED],
                               dry_sequence_breakers=["@"]), **changes)
    assert sampler_init_error(p) is None
    drawn = [step for _ in range(5) for step in run_chain(p)]
    tokens = {token for token, _ in drawn}
    assert not tokens & set(BANNED)
    assert all(not mx.any(mx.isnan(probs)).item() for _, probs in drawn if probs is not None)
    if allowed is not None:
        assert tokens <= allowed, tokens


def test_scale_keeps_the_best_and_the_bans():
    logits = mx.array([[1.0, 3.0, float("-inf"), FLT_MAX]])
    assert scale(logits, 0.0).tolist() == [[float("-inf"), float("-inf"), float("-inf"), 0.0]]
    assert scale(logits, float("inf")).tolist() == [[0.0, 0.0, float("-inf"), 0.0]]
    # a finite quotient is the reference's exact division (a later repeat penalty reads its sign)
    assert scale(mx.array([[1.0, 3.0], [-2.0, 1.0]]), 2.0).tolist() == [[0.5, 1.5], [-1.0, 0.5]]
    # a row that would overflow is shifted (the best 0, the far worse -inf), the others divided
    assert scale(mx.array([[1.0, 3.0], [1e38, 1.0]]), 0.01).tolist() == [
        [100.0, 300.0], [0.0, float("-inf")]]


@pytest.mark.parametrize(("changes", "error"), [
    ({"repeat_penalty": 0.0}, "penalty_repeat must be finite and greater than 0"),
    ({"repeat_penalty": -1.0}, "penalty_repeat must be finite and greater than 0"),
    ({"repeat_penalty": float("inf")}, "penalty_repeat must be finite and greater than 0"),
    ({"repeat_penalty": f32(1e-39)}, "penalty_repeat must be finite and greater than 0"),
    ({"repeat_penalty": f32(1e-30)}, None),  # its reciprocal is finite
    ({"frequency_penalty": float("-inf")}, "penalty_freq must be finite"),
    ({"presence_penalty": float("inf")}, "penalty_present must be finite"),
    ({"presence_penalty": FLT_MAX, "frequency_penalty": -FLT_MAX}, None),
])
def test_sampler_init_refusals(changes, error):
    assert sampler_init_error(replace(SamplingParams(), **changes)) == error


def test_reasoning_end_forces_after_the_token_in_flight():
    """The control route's force (BudgetState.force_now) comes between steps, after a token was
    sampled and before the processor accepts it: that token is accepted as itself, then the
    whole forced sequence follows."""
    from engine.reasoning_budget import BudgetState, TagMatcher

    state = BudgetState(10**9, TagMatcher([[7]]), TagMatcher([[9]]), [5, 9],
                        pieces=[b"x"] * 16)
    for token in (7, 1):  # opens, then counts down
        state.accept(token)
    assert state.force_now()
    state.accept(2)  # sampled before the force: not the message's first token
    forced = []
    while (token := state.forced_token()) is not None:
        forced.append(token)
        state.accept(token)
    assert forced == [5, 9] and not state.active
    assert not state.force_now()  # done: nothing to end
