"""The sampler chain on crafted logits: DRY, mirostat 1 and 2, adaptive-p, post-sampling records,
seed determinism, the reasoning budget's state machine. No model, no Ray."""

from __future__ import annotations

import math

import mlx.core as mx
import pytest

from engine import sampling
from engine.sampling import (
    COUNTING,
    DONE,
    WAITING_UTF8,
    budget_state,
    dry_breakers,
    dry_penalties,
    make_processors,
    make_sampler,
    prefill_tokens,
    reasoning_budget_processor,
    recorder,
)
from engine.types import ReasoningBudget, SamplingParams

N_VOCAB = 8


def logits_for(probs: list[float]) -> mx.array:
    return mx.log(mx.array([probs], dtype=mx.float32))


def draws(params: SamplingParams, logits: mx.array, n: int = 40, seed: int = 1) -> list[int]:
    sample = make_sampler(params, seed, logits.shape[-1])
    return [sample(logits).item() for _ in range(n)]


# ---- DRY ----------------------------------------------------------------------------------
def test_dry_penalizes_the_token_that_extends_a_repeat():
    # "1 2 3" repeats the earlier "1 2 3", which was followed by 4: 4 would extend a 3-token repeat
    penalties = dry_penalties([1, 2, 3, 4, 1, 2, 3], multiplier=1.0, base=2.0,
                              allowed_length=2, breakers={})
    assert penalties == {4: 2.0 ** (3 - 2)}


def test_dry_allowed_length_and_breakers_limit_the_repeat():
    sequence = [1, 2, 3, 4, 1, 2, 3]
    assert dry_penalties(sequence, 1.0, 2.0, allowed_length=4, breakers={}) == {}
    # 2 is a single-token breaker: a repeat cannot reach back past it
    assert dry_penalties(sequence, 1.0, 2.0, allowed_length=2, breakers={2: [()]}) == {}
    # a breaker token itself is never penalized
    assert dry_penalties([5, 1, 2, 5, 1, 2], 1.0, 2.0, 2, breakers={5: [()]}) == {}


def test_dry_breakers_cover_pieces_that_contain_or_start_a_breaker():
    pieces = [b"a", b"\n", b"x\n", b"ab", b"zz"]
    table = dry_breakers(pieces, lambda text: [40 + len(text)], ["\n", "b:"])
    assert table[1] == [()] and table[2] == [()]
    assert table[3] == [(41,)]  # "ab" ends with "b", the rest ":" tokenizes to [41]
    assert 0 not in table and 4 not in table


def test_dry_processor_applies_penalties_to_logits():
    params = SamplingParams(dry_multiplier=0.5, dry_base=3.0, dry_allowed_length=2,
                            dry_penalty_last_n=64)
    (process,) = make_processors(params, N_VOCAB, breakers={})
    out = process(mx.array([1, 2, 3, 4, 1, 2, 3]), mx.zeros((1, N_VOCAB)))
    expected = [0.0] * N_VOCAB
    expected[4] = -0.5 * 3.0
    assert out[0].tolist() == pytest.approx(expected)


def test_dry_penalty_last_n_limits_the_window():
    params = SamplingParams(dry_multiplier=1.0, dry_penalty_last_n=3)
    (process,) = make_processors(params, N_VOCAB, breakers={})
    out = process(mx.array([1, 2, 3, 4, 1, 2, 3]), mx.zeros((1, N_VOCAB)))
    assert out[0].tolist() == [0.0] * N_VOCAB


def test_mirostat_drops_penalties_and_dry():
    params = SamplingParams(mirostat=2, repeat_penalty=2.0, dry_multiplier=1.0)
    assert make_processors(params, N_VOCAB, breakers={}) == []


# ---- mirostat -----------------------------------------------------------------------------
FLAT = [0.3, 0.2, 0.15, 0.1, 0.1, 0.07, 0.05, 0.03]


def test_mirostat_v2_keeps_candidates_under_the_target_surprise():
    low = SamplingParams(temperature=1.0, mirostat=2, mirostat_tau=0.8, mirostat_eta=0.0)
    assert set(draws(low, logits_for(FLAT))) == {0}  # mu = 1.6 bits keeps only p >= 0.33
    high = SamplingParams(temperature=1.0, mirostat=2, mirostat_tau=10.0, mirostat_eta=0.0)
    assert len(set(draws(high, logits_for(FLAT)))) > 3


def test_mirostat_v2_learning_rate_moves_mu():
    # tau 1.2 (mu 2.4 bits keeps p >= 0.19: tokens 0 and 1); eta pushes mu towards the target
    fixed = SamplingParams(temperature=1.0, mirostat=2, mirostat_tau=1.2, mirostat_eta=0.0)
    assert set(draws(fixed, logits_for(FLAT))) == {0, 1}
    moving = SamplingParams(temperature=1.0, mirostat=2, mirostat_tau=1.2, mirostat_eta=1.0)
    assert set(draws(moving, logits_for(FLAT))) != {0, 1}


def test_mirostat_v1_truncates_to_the_estimated_k():
    zipf = [1 / (i + 1) for i in range(N_VOCAB)]
    total = sum(zipf)
    logits = logits_for([z / total for z in zipf])
    tight = SamplingParams(temperature=1.0, mirostat=1, mirostat_tau=0.05, mirostat_eta=0.0)
    assert set(draws(tight, logits)) == {0}
    loose = SamplingParams(temperature=1.0, mirostat=1, mirostat_tau=8.0, mirostat_eta=0.0)
    assert len(set(draws(loose, logits))) > 3


# ---- adaptive-p ---------------------------------------------------------------------------
PEAKED = [0.9, 0.04, 0.03, 0.01, 0.01, 0.005, 0.003, 0.002]
ADAPTIVE = ["top_k", "adaptive_p"]


def test_adaptive_p_targets_the_requested_probability():
    plain = SamplingParams(temperature=1.0, top_k=0, samplers=ADAPTIVE)  # target -1: plain draw
    assert draws(plain, logits_for(PEAKED)).count(0) > 25
    low = SamplingParams(temperature=1.0, top_k=0, samplers=ADAPTIVE, adaptive_target=0.02)
    assert 0 not in draws(low, logits_for(PEAKED))


def test_adaptive_p_only_runs_when_listed():
    unlisted = SamplingParams(temperature=1.0, top_k=0, adaptive_target=0.02)
    assert draws(unlisted, logits_for(PEAKED)).count(0) > 25


def test_adaptive_decay_weights_the_history():
    def second_step(decay: float) -> list[float]:
        recorded: list[mx.array] = []
        params = SamplingParams(temperature=1.0, top_k=0, samplers=ADAPTIVE,
                                adaptive_target=0.5, adaptive_decay=decay)
        sample = make_sampler(params, 3, N_VOCAB, recorded.append)
        sample(logits_for(PEAKED))
        sample(logits_for(PEAKED))
        return recorded[1][0].tolist()

    assert second_step(0.0) != pytest.approx(second_step(0.9))


# ---- post-sampling records, raw-logit records, seeds ----------------------------------------
def test_post_sampling_record_is_the_filtered_distribution():
    recorded: list[mx.array] = []
    params = SamplingParams(temperature=1.0, top_k=2, top_p=1.0, min_p=0.0)
    sample = make_sampler(params, 5, N_VOCAB, recorded.append)
    token = sample(logits_for(FLAT)).item()
    probs = recorded[0][0].tolist()
    assert token in (0, 1)
    assert probs[:2] == pytest.approx([0.6, 0.4], abs=1e-5) and probs[2:] == [0.0] * 6


def test_recorder_sees_the_raw_logits_before_bias():
    seen: list[mx.array] = []
    params = SamplingParams(logit_bias=[(0, None)])
    processors = [recorder(seen.append), *make_processors(params, N_VOCAB)]
    logits = logits_for(FLAT)
    for process in processors:
        logits = process(mx.array([1]), logits)
    assert math.isfinite(seen[0][0, 0].item()) and logits[0, 0].item() == float("-inf")


def test_seed_determinism_at_temperature():
    params = SamplingParams(temperature=1.5, top_k=0, top_p=1.0, min_p=0.0)
    assert draws(params, logits_for(FLAT), seed=9) == draws(params, logits_for(FLAT), seed=9)
    assert draws(params, logits_for(FLAT), seed=9) != draws(params, logits_for(FLAT), seed=10)


def test_zero_temperature_is_greedy_after_filters_that_drop_the_top():
    assert set(draws(SamplingParams(temperature=0.0), logits_for(FLAT))) == {0}
    xtc = SamplingParams(temperature=0.0, xtc_probability=1.0, xtc_threshold=0.12)
    assert set(draws(xtc, logits_for(FLAT))) == {2}  # the least likely above the threshold
    unlisted = SamplingParams(temperature=0.0, samplers=["top_k"], top_k=0)  # never applied
    assert len(set(draws(unlisted, logits_for(FLAT)))) > 1


def test_typical_and_dynamic_temperature_filters():
    from engine.sampling import temperature_filter, typical_filter

    logits = logits_for([0.5, 0.2, 0.1, 0.1, 0.05, 0.05, 0.0, 0.0])
    kept = typical_filter(0.2, 0)(logits)[0].tolist()
    assert [i for i, v in enumerate(kept) if v > float("-inf")] == [1]  # nearest the entropy
    flat, peaked = logits_for([0.125] * 8), logits_for(PEAKED)
    # the temperature grows with the entropy: a flat distribution gets the highest one
    t_flat = (flat / temperature_filter(1.0, 0.5, 1.0)(flat))[0, 0].item()
    t_peaked = (peaked / temperature_filter(1.0, 0.5, 1.0)(peaked))[0, 0].item()
    assert t_flat == pytest.approx(1.5, rel=1e-4) and 0.5 < t_peaked < 1.0


def test_greedy_with_bias_picks_what_the_bias_processor_then_greedy_picks():
    """The shared sampler that replaces a lone logit-bias processor under greedy sampling."""
    logits = mx.random.normal((4, 50), key=mx.random.key(3))
    bias = ((int(mx.argmax(logits[0]).item()), None), (7, 2.5), (11, -1.0))
    processed = sampling.logit_bias_processor(list(bias), 50)(mx.array([]), logits)
    logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
    shared = sampling.greedy_with_bias(bias, 50)
    assert shared is sampling.greedy_with_bias(bias, 50) and sampling.is_shared(shared)
    assert shared(logprobs).tolist() == mx.argmax(processed, axis=-1).tolist()


# ---- reasoning budget: start tag 1, end tags (2,) and (5, 5, 6), forced 7 then 2 ----------------
def budget(n: int, pieces: list[bytes] | None = None, prefill: tuple[int, ...] = ()):
    spec = ReasoningBudget(n, [1], [[2], [5, 5, 6]], [7, 2])
    return budget_state(spec, pieces or [b"x"] * N_VOCAB, list(prefill))


def feed(state, tokens: list[int]) -> list[int | None]:
    """What the budget forces after each token."""
    out = []
    for token in tokens:
        state.accept(token)
        out.append(state.forced_token())
    return out


def test_reasoning_budget_counts_from_the_start_tag_then_forces_and_reopens():
    state = budget(2)
    assert feed(state, [3, 3, 1, 3, 3, 7, 2]) == [None, None, None, None, 7, 2, None]
    assert state.phase == DONE
    assert feed(state, [3, 1]) == [None, None] and state.phase == COUNTING  # a fresh budget
    assert feed(budget(0), [1]) == [7]  # a budget of 0 forces at once


def test_reasoning_budget_ends_naturally_on_any_end_tag():
    # 5 5 5 6 ends with the end tag 5 5 6: the 5s are counted, the token ending the tag is not
    state = budget(4)
    assert feed(state, [1, 5, 5, 5, 6]) == [None] * 5 and state.phase == DONE
    assert feed(budget(3), [1, 5, 5, 5]) == [None, None, None, 7]


def test_reasoning_budget_waits_for_a_whole_character():
    pieces = [b"x"] * N_VOCAB
    pieces[3], pieces[4] = b"\xe2\x82", b"\xac"  # each piece alone ends mid-character
    state = budget(1, pieces)
    assert feed(state, [1, 3, 4]) == [None, None, None] and state.phase == WAITING_UTF8
    assert feed(state, [0]) == [7]


def test_reasoning_budget_prefill_and_processor():
    assert budget(2, prefill=(3, 1)).phase == COUNTING  # the generation prompt opened it
    special = [b" ", b"<think>"]
    assert prefill_tokens("<think>", lambda text: [0, 1], special) == [1]  # a tokenizer's space
    assert prefill_tokens(" <think>", lambda text: [0, 1], special) == [0, 1]
    process = reasoning_budget_processor(budget(0))
    logits = mx.zeros((1, N_VOCAB))
    assert process(mx.array([1]), logits) is logits  # the prompt's last token is not accepted
    forced = process(mx.array([1, 1]), logits)[0].tolist()  # the start tag was generated
    assert forced[7] == 0.0 and forced.count(float("-inf")) == N_VOCAB - 1


def test_logit_bias_fits_logits_wider_than_the_vocabulary():
    """Models with padded embeddings return more logit columns than tokenizer entries."""
    bias = ((3, None), (5, 10.0))
    logits = mx.zeros((2, 12))
    processed = sampling.logit_bias_processor(list(bias), 10)(mx.array([]), logits)
    assert processed.shape == (2, 12) and processed[0, 3].item() == float("-inf")
    assert sampling.greedy_with_bias(bias, 10)(logits).tolist() == [5, 5]
