"""The sampler chain on crafted logits, against values computed by hand: DRY, mirostat 1 and 2,
adaptive-p, infill, post-sampling records, seed determinism, the reasoning budget's state
machine. No model, no Ray (tests/engine/test_chain.py runs the chain on the model's logits)."""

from __future__ import annotations

import math

import mlx.core as mx
import numpy as np
import pytest

from engine import penalties
from engine.chain import InfillVocab, chain_processor, infill_keep
from engine.penalties import (
    dry_breakers,
    dry_penalties,
    dry_processor,
    make_processors,
    recorder,
)
from engine.reasoning_budget import (
    COUNTING,
    DONE,
    WAITING_UTF8,
    budget_state,
    prefill_tokens,
    reasoning_budget_processor,
)
from engine.sampling import make_sampler
from engine.types import ReasoningBudget, SamplingParams

N_VOCAB = 8


def logits_for(probs: list[float]) -> mx.array:
    return mx.log(mx.array([probs], dtype=mx.float32))


def chained(params: SamplingParams, seed: int, n_vocab: int, record=None):
    """What one sequence's step does: the chain (a logits processor), the normalization
    mlx-lm applies, the draw."""
    chain = chain_processor(params, seed, {}, None)
    sample = make_sampler(params, seed, n_vocab, record)

    def step(logits: mx.array, tokens: mx.array = mx.array([0])) -> int:
        if chain is not None:
            logits = chain(tokens, logits)
        return sample(logits - mx.logsumexp(logits, axis=-1, keepdims=True)).item()

    return step


def draws(params: SamplingParams, logits: mx.array, n: int = 40, seed: int = 1) -> list[int]:
    step = chained(params, seed, logits.shape[-1])
    return [step(logits) for _ in range(n)]


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
    process = dry_processor(params, {})
    out = process(mx.array([1, 2, 3, 4, 1, 2, 3]), mx.zeros((1, N_VOCAB)))
    expected = [0.0] * N_VOCAB
    expected[4] = -0.5 * 3.0
    assert out[0].tolist() == pytest.approx(expected)


def test_dry_penalty_last_n_limits_the_window():
    params = SamplingParams(dry_multiplier=1.0, dry_penalty_last_n=3)
    process = dry_processor(params, {})
    out = process(mx.array([1, 2, 3, 4, 1, 2, 3]), mx.zeros((1, N_VOCAB)))
    assert out[0].tolist() == [0.0] * N_VOCAB


def test_mirostat_drops_the_chain_penalties_and_dry_included():
    params = SamplingParams(mirostat=2, repeat_penalty=2.0, dry_multiplier=1.0)
    assert chain_processor(params, 0, {}, None) is None
    unmirrored = SamplingParams(repeat_penalty=2.0, dry_multiplier=1.0, samplers=["penalties"])
    penalized = chain_processor(unmirrored, 0, {}, None)(mx.array([3]), mx.ones((1, N_VOCAB)))
    assert penalized[0].tolist() == [1.0] * 3 + [0.5] + [1.0] * 4


# ---- mirostat -----------------------------------------------------------------------------
FLAT = [0.3, 0.2, 0.15, 0.1, 0.1, 0.07, 0.05, 0.03]


def test_mirostat_v2_keeps_candidates_under_the_target_surprise():
    low = SamplingParams(temperature=1.0, mirostat=2, mirostat_tau=0.8, mirostat_eta=0.0)
    assert set(draws(low, logits_for(FLAT))) == {0}  # mu = 1.6 bits keeps only p >= 0.33
    high = SamplingParams(temperature=1.0, mirostat=2, mirostat_tau=10.0, mirostat_eta=0.0)
    assert len(set(draws(high, logits_for(FLAT)))) > 3


def test_mirostat_v2_learning_rate_moves_mu():
    """tau 1.2: mu starts at 2.4 bits and keeps p >= 0.19 (tokens 0 and 1, renormalized to 0.6
    and 0.4); the draw's surprise moves mu by eta times its error, and the next step keeps
    exactly the candidates under the new mu."""
    fixed = SamplingParams(temperature=1.0, mirostat=2, mirostat_tau=1.2, mirostat_eta=0.0)
    assert set(draws(fixed, logits_for(FLAT))) == {0, 1}
    recorded: list[mx.array] = []
    moving = SamplingParams(temperature=1.0, mirostat=2, mirostat_tau=1.2, mirostat_eta=1.0)
    step = chained(moving, 4, N_VOCAB, recorded.append)
    first = step(logits_for(FLAT))
    step(logits_for(FLAT))
    assert recorded[0][0].tolist()[:2] == pytest.approx([0.6, 0.4], abs=1e-6)
    mu = 2.4 - 1.0 * (-math.log2([0.6, 0.4][first]) - 1.2)
    kept = [p for p in FLAT if -math.log2(p) <= mu] or FLAT[:1]
    expected = [p / sum(kept) for p in kept] + [0.0] * (N_VOCAB - len(kept))
    assert recorded[1][0].tolist() == pytest.approx(expected, abs=1e-6)
    assert len(kept) != 2, f"mu {mu:.2f} keeps what 2.4 kept: the case proves nothing"


def test_mirostat_v1_truncates_to_the_estimated_k():
    """p_i proportional to 1/(i+1)^2: the Zipf exponent estimate is exactly 2, so
    k = (2^mu / (1 - 1/n))^(1/2) with n = 8: mu 2 gives k 2.14 (the top 2), mu 4 gives 4.28."""
    zipf = [1 / (i + 1) ** 2 for i in range(N_VOCAB)]
    logits = logits_for([z / sum(zipf) for z in zipf])
    for tau, k in ((1.0, 2), (2.0, 4)):
        assert int((2 ** (2 * tau) / (1 - 1 / N_VOCAB)) ** 0.5) == k
        recorded: list[mx.array] = []
        params = SamplingParams(temperature=1.0, mirostat=1, mirostat_tau=tau, mirostat_eta=0.0)
        chained(params, 3, N_VOCAB, recorded.append)(logits)
        top = zipf[:k]
        expected = [z / sum(top) for z in top] + [0.0] * (N_VOCAB - k)
        assert recorded[0][0].tolist() == pytest.approx(expected, abs=1e-6)


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


def adaptive_shape(probs: list[float], adapted: float) -> list[float]:
    """adaptive-p's distribution: logit 5 - 10 d^2 / (1 + d), d = |p - adapted| / 0.3."""
    logits = [5 - 10 * d * d / (1 + d) for d in (abs(p - adapted) / 0.3 for p in probs)]
    total = sum(math.exp(x) for x in logits)
    return [math.exp(x) / total for x in logits]


@pytest.mark.parametrize("decay", [0.0, 0.9])
def test_adaptive_decay_weights_the_history(decay):
    """The first step aims at the target itself (the history starts at target / (1 - decay)
    over 1 / (1 - decay)); the second at 2 x target minus the decayed average of the drawn
    tokens' original probabilities."""
    recorded: list[mx.array] = []
    params = SamplingParams(temperature=1.0, top_k=0, samplers=ADAPTIVE, adaptive_target=0.5,
                            adaptive_decay=decay)
    step = chained(params, 3, N_VOCAB, recorded.append)
    first = step(logits_for(PEAKED))
    step(logits_for(PEAKED))
    assert recorded[0][0].tolist() == pytest.approx(adaptive_shape(PEAKED, 0.5), abs=1e-5)
    total = PEAKED[first] + decay * 0.5 / (1 - decay)
    weight = 1 + decay / (1 - decay)
    adapted = min(max(2 * 0.5 - total / weight, 0.0), 1.0)
    assert recorded[1][0].tolist() == pytest.approx(adaptive_shape(PEAKED, adapted), abs=1e-5)


# ---- infill ---------------------------------------------------------------------------------
# "a" starts "ab" and "abc"; id 4 ends the generation (its piece is empty, as a special token's)
INFILL = InfillVocab([b"a", b"ab", b"x", b"y", b"", b"abc", b"q", b"r"], frozenset({4}), 4)


def kept(probs: list[float]) -> dict[int, float]:
    out = infill_keep(np.log(np.array(probs, dtype=np.float32)), INFILL)
    finite = np.isfinite(out)
    weights = np.exp(out[finite] - out[finite].max())
    return dict(zip(np.flatnonzero(finite).tolist(), (weights / weights.sum()).tolist()))


def test_infill_merges_prefixes_then_keeps_the_likely():
    """Six candidates (q and r have probability 0): 3 x 0.05 x 6 = 0.9 < 0.95, the text wins.
    "a" (0.30) takes "ab" (0.25) and "abc" (0.05): 0.60; "y" 0.22 passes 0.2, "x" 0.13 does
    not; renormalized over a, y and the end (0.87), "y" (0.25) is under 1/3 and leaves. The kept
    tokens keep their own logits: a 0.30 against the end's 0.05."""
    probs = [0.30, 0.25, 0.13, 0.22, 0.05, 0.05, 0.0, 0.0]
    assert kept(probs) == pytest.approx({0: 0.30 / 0.35, 4: 0.05 / 0.35}, abs=1e-6)


def test_infill_ends_when_the_end_is_likely_or_no_text_is():
    # 3 x 0.3 x 6 = 5.4 > 0.7: the end-of-generation tokens alone
    assert kept([0.20, 0.15, 0.15, 0.15, 0.30, 0.05, 0.0, 0.0]) == {4: 1.0}
    # ten text tokens of 0.0999, none a prefix of another, the end 0.001 (3 x 0.001 x 11 =
    # 0.033): no text token reaches 0.2, so the end of text (id 10) alone, with logit 1
    ten = InfillVocab([f"t{i}|".encode() for i in range(10)] + [b""], frozenset({10}), 10)
    out = infill_keep(np.log(np.array([0.0999] * 10 + [0.001], dtype=np.float32)), ten)
    assert out.tolist() == [float("-inf")] * 10 + [1.0]


# ---- post-sampling records, raw-logit records, seeds ----------------------------------------
def test_post_sampling_record_is_the_filtered_distribution():
    recorded: list[mx.array] = []
    params = SamplingParams(temperature=1.0, top_k=2, top_p=1.0, min_p=0.0)
    token = chained(params, 5, N_VOCAB, recorded.append)(logits_for(FLAT))
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
    flat, peaked = logits_for([0.1251] + [0.1249] * 7), logits_for(PEAKED)

    def temperature(logits: mx.array) -> float:  # the filter divides the logits
        scaled = temperature_filter(1.0, 0.5, 1.0)(logits)
        return (logits[0, 1] / scaled[0, 1]).item()

    # the temperature grows with the entropy: a flat distribution gets the highest one
    assert temperature(flat) == pytest.approx(1.5, rel=1e-4) and 0.5 < temperature(peaked) < 1.0


def test_greedy_with_bias_picks_what_the_bias_processor_then_greedy_picks():
    """The shared sampler that replaces a lone logit-bias processor under greedy sampling."""
    logits = mx.random.normal((4, 50), key=mx.random.key(3))
    bias = ((int(mx.argmax(logits[0]).item()), None), (7, 2.5), (11, -1.0))
    processed = penalties.logit_bias_processor(list(bias), 50)(mx.array([]), logits)
    logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
    shared = penalties.greedy_with_bias(bias, 50)
    assert shared is penalties.greedy_with_bias(bias, 50) and penalties.is_shared(shared)
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
    processed = penalties.logit_bias_processor(list(bias), 10)(mx.array([]), logits)
    assert processed.shape == (2, 12) and processed[0, 3].item() == float("-inf")
    assert penalties.greedy_with_bias(bias, 10)(logits).tolist() == [5, 5]
