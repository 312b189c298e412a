"""The sampler chain against hand-computed expectations: for each sampler no reference capture
covers (typical, XTC, min_keep, mirostat 1, adaptive-p, the presence and frequency penalties,
DRY's and the penalties' windows, infill) and for every position in ``samplers`` (penalties and
DRY included), the candidates and probabilities the real route leaves before the random draw
(``post_sampling_probs``) equal tests/chain_reference.py's numpy chain run on the model's own
logits for the same prompt. Each positional case also checks that the position matters: the
same samplers in another order expect something else."""

from __future__ import annotations

import math

import mlx.core as mx
import numpy as np
import pytest

from ..chain_reference import State, Vocabulary, post_sampling
from ..conftest import MODEL

REPEAT = ("for x in items:\n    total = total + x\n    total = total + x\n    total = total + x\n"
          "    total")
SELF, PRINT = "self.", "print("
END = ("initialized = True\n\ndef main():\n    print(\"Hello world!\")\n\nif __name__ == "
       "'__main__':\n    main()\n")  # greedily ends at once (capture eos_immediate)
TOLERANCE = 2e-4  # the server's batched prefill against one forward pass here
N_PROBS = 2000  # every candidate left (the vocabulary's size)


@pytest.fixture(scope="module")
def model():
    from mlx_lm import load

    return load(MODEL)[0]


@pytest.fixture(scope="module")
def vocab():
    from engine.vocab import load_vocab

    v = load_vocab(MODEL)
    return v, Vocabulary(v.special_pieces, v.pieces, set(v.eog_ids), v.hf.eos_token_id)


def logits_of(model, tokens: list[int]) -> np.ndarray:
    return np.array(model(mx.array([tokens]))[0, -1].astype(mx.float32))


def served(client, body: dict, n_predict: int = 1) -> list[dict]:
    """Each step's post-sampling record: the drawn token and the candidates."""
    r = client.post("/completion", json={"n_predict": n_predict, "n_probs": N_PROBS,
                                         "post_sampling_probs": True, "cache_prompt": False,
                                         "seed": 5, **body})
    assert r.status_code == 200, r.text
    return r.json()["completion_probabilities"]


def candidates(step: dict) -> list[tuple[int, float]]:
    return [(c["id"], c["prob"]) for c in step["top_probs"]]


def distance(a: list[tuple[int, float]], b: list[tuple[int, float]]) -> float:
    """The largest probability difference over every candidate of either list."""
    da, db = dict(a), dict(b)
    return max(abs(da.get(i, 0.0) - db.get(i, 0.0)) for i in set(da) | set(db))


def expected(model, vocab, body: dict, state: State | None = None,
             after: tuple[int, ...] = ()) -> list[tuple[int, float]]:
    v, info = vocab
    tokens = v.tokenize(body["prompt"], add_special=True) + list(after)
    return post_sampling(logits_of(model, tokens), tokens, body, info, state)


def check(client, model, vocab, body: dict, other_order: list[str] | None = None) -> State:
    """The route's candidates equal the expectation; with ``other_order``, the same samplers in
    that order would expect something else (so the order is what the case proves)."""
    state = State()
    want = expected(model, vocab, body, state)
    got = candidates(served(client, body)[0])
    assert distance(got, want) <= TOLERANCE, (got[:8], want[:8])
    if other_order is not None:
        other = expected(model, vocab, {**body, "samplers": other_order})
        assert distance(other, want) > 50 * TOLERANCE, "the order changes nothing here"
    return state


# ---- every position --------------------------------------------------------------------------
K8 = {"top_k": 8, "temperature": 0.7}
K4 = {"top_k": 4, "temperature": 0.7}
POSITIONS = {
    "penalties_first": ({"prompt": REPEAT, **K4, "repeat_penalty": 3.0,
                         "samplers": ["penalties", "top_k", "temperature"]},
                        ["top_k", "penalties", "temperature"]),
    "penalties_after_top_k": ({"prompt": REPEAT, **K4, "repeat_penalty": 3.0,
                               "samplers": ["top_k", "penalties", "temperature"]},
                              ["penalties", "top_k", "temperature"]),
    "penalties_after_temperature": ({"prompt": REPEAT, **K8, "frequency_penalty": 0.8,
                                     "presence_penalty": 0.5,
                                     "samplers": ["top_k", "temperature", "penalties"]},
                                    ["top_k", "penalties", "temperature"]),
    "penalties_after_min_p": ({"prompt": REPEAT, "min_p": 0.05, "repeat_penalty": 3.0,
                               "samplers": ["min_p", "penalties"]}, ["penalties", "min_p"]),
    "dry_after_top_k": ({"prompt": REPEAT, "top_k": 4, "temperature": 1.0,
                         "dry_multiplier": 4.0, "samplers": ["top_k", "dry", "temperature"]},
                        ["dry", "top_k", "temperature"]),
    "dry_after_temperature": ({"prompt": REPEAT, "top_k": 10, "temperature": 0.5,
                               "dry_multiplier": 0.8,
                               "samplers": ["top_k", "temperature", "dry"]},
                              ["top_k", "dry", "temperature"]),
    "typical_before_temperature": ({"prompt": SELF, "top_k": 30, "typical_p": 0.5,
                                    "temperature": 0.6,
                                    "samplers": ["top_k", "typ_p", "temperature"]},
                                   ["top_k", "temperature", "typ_p"]),
    "typical_after_temperature": ({"prompt": SELF, "top_k": 30, "typical_p": 0.5,
                                   "temperature": 0.6,
                                   "samplers": ["top_k", "temperature", "typ_p"]},
                                  ["top_k", "typ_p", "temperature"]),
    "xtc_before_temperature": ({"prompt": PRINT, "top_k": 20, "xtc_probability": 1.0,
                                "xtc_threshold": 0.04, "temperature": 1.6,
                                "samplers": ["top_k", "xtc", "temperature"]},
                               ["top_k", "temperature", "xtc"]),
    "xtc_after_temperature": ({"prompt": PRINT, "top_k": 20, "xtc_probability": 1.0,
                               "xtc_threshold": 0.04, "temperature": 1.6,
                               "samplers": ["top_k", "temperature", "xtc"]},
                              ["top_k", "xtc", "temperature"]),
    "min_p_after_temperature": ({"prompt": SELF, "min_p": 0.2, "temperature": 1.8,
                                 "samplers": ["temperature", "min_p"]},
                                ["min_p", "temperature"]),
    "top_n_sigma_after_top_k": ({"prompt": PRINT, "top_k": 12, "top_n_sigma": 0.8,
                                 "temperature": 1.0,
                                 "samplers": ["top_k", "top_n_sigma", "temperature"]},
                                ["top_n_sigma", "top_k", "temperature"]),
    "temperature_first": ({"prompt": PRINT, "top_k": 40, "top_p": 0.6, "temperature": 1.5,
                           "samplers": ["temperature", "top_p", "top_k"]},
                          ["top_k", "top_p", "temperature"]),
}


@pytest.mark.parametrize("case", list(POSITIONS))
def test_samplers_in_every_position(client, model, vocab, case):
    body, other_order = POSITIONS[case]
    check(client, model, vocab, body, other_order)


# ---- the samplers no capture covers ----------------------------------------------------------
@pytest.mark.parametrize("body", [
    {"prompt": SELF, "typical_p": 0.3, "top_k": 0, "top_p": 1.0, "min_p": 0.0,
     "temperature": 1.0},
    {"prompt": PRINT, "typical_p": 0.9, "top_k": 0, "top_p": 1.0, "min_p": 0.0,
     "temperature": 1.0},
], ids=["0.3", "0.9"])
def test_typical_p_keeps_the_locally_typical_candidates(client, model, vocab, body):
    check(client, model, vocab, body)


@pytest.mark.parametrize("body", [
    {"prompt": PRINT, "xtc_probability": 1.0, "xtc_threshold": 0.05, "top_k": 0, "top_p": 1.0,
     "min_p": 0.0, "temperature": 1.0},
    {"prompt": SELF, "xtc_probability": 1.0, "xtc_threshold": 0.03, "top_k": 0, "top_p": 1.0,
     "min_p": 0.0, "temperature": 1.0},
    {"prompt": SELF, "xtc_probability": 1.0, "xtc_threshold": 0.6, "temperature": 1.0},
], ids=["print", "self", "threshold_over_half_is_off"])
def test_xtc_excludes_the_top_choices(client, model, vocab, body):
    check(client, model, vocab, body)


@pytest.mark.parametrize("body", [
    {"prompt": SELF, "min_p": 0.6, "min_keep": 6, "top_k": 0, "top_p": 1.0,
     "temperature": 1.0},
    {"prompt": SELF, "top_p": 0.1, "min_keep": 5, "top_k": 0, "min_p": 0.0,
     "temperature": 1.0},
    {"prompt": SELF, "typical_p": 0.1, "min_keep": 20, "top_k": 0, "top_p": 1.0, "min_p": 0.0,
     "temperature": 1.0},
    {"prompt": PRINT, "xtc_probability": 1.0, "xtc_threshold": 0.02, "min_keep": 1999,
     "top_k": 0, "top_p": 1.0, "min_p": 0.0, "temperature": 1.0},
], ids=["min_p", "top_p", "typical_p", "xtc"])
def test_min_keep_keeps_that_many(client, model, vocab, body):
    check(client, model, vocab, body)
    without = expected(model, vocab, {**body, "min_keep": 0})
    assert distance(without, expected(model, vocab, body)) > 50 * TOLERANCE


@pytest.mark.parametrize("body", [
    {"prompt": REPEAT, "frequency_penalty": 0.7, "top_k": 0, "top_p": 1.0, "min_p": 0.0,
     "temperature": 1.0},
    {"prompt": REPEAT, "presence_penalty": 1.5, "top_k": 0, "top_p": 1.0, "min_p": 0.0,
     "temperature": 1.0},
    {"prompt": REPEAT, "frequency_penalty": -0.3, "presence_penalty": 0.4, "repeat_penalty": 1.2,
     "top_k": 0, "top_p": 1.0, "min_p": 0.0, "temperature": 1.0},
], ids=["frequency", "presence", "all_three"])
def test_frequency_and_presence_penalties(client, model, vocab, body):
    check(client, model, vocab, body)


def test_repeat_last_n_bounds_the_window(client, model, vocab):
    """Only the last repeat_last_n tokens of the context are penalized."""
    body = {"prompt": REPEAT, "repeat_penalty": 2.0, "repeat_last_n": 3, "top_k": 0,
            "top_p": 1.0, "min_p": 0.0, "temperature": 1.0}
    check(client, model, vocab, body)
    whole = expected(model, vocab, {**body, "repeat_last_n": 64})
    assert distance(whole, expected(model, vocab, body)) > 50 * TOLERANCE


@pytest.mark.parametrize("body", [
    {"dry_allowed_length": 4},
    {"dry_penalty_last_n": 12},
    {"dry_sequence_breakers": ["\n"]},
    {"dry_base": 1.5, "dry_allowed_length": 1},
], ids=["allowed_length", "penalty_last_n", "sequence_breakers", "base"])
def test_dry_settings(client, model, vocab, body):
    plain = {"prompt": REPEAT, "dry_multiplier": 0.05, "dry_base": 1.2,
             "dry_sequence_breakers": ["@"], "top_k": 0, "top_p": 1.0, "min_p": 0.0,
             "temperature": 1.0}
    body = {**plain, **body}
    check(client, model, vocab, body)
    assert distance(expected(model, vocab, plain), expected(model, vocab, body)) > 50 * TOLERANCE


def test_mirostat_v1_keeps_the_estimated_k(client, model, vocab):
    """mu starts at 2 tau: the Zipf exponent estimated from the top 100 candidates gives k."""
    body = {"prompt": PRINT, "mirostat": 1, "mirostat_tau": 4.0, "temperature": 1.0}
    state = check(client, model, vocab, body)
    assert abs(state.notes["k"] - round(state.notes["k"])) > 1e-3  # clear of a rounding edge
    assert 1 < int(state.notes["k"]) < 2000


TAU, ETA = 1.0, 3.0  # the first step keeps one candidate: mu moves from 2 to 5


@pytest.mark.parametrize("version", [1, 2])
def test_mirostat_eta_moves_mu_by_the_surprise(client, model, vocab, version):
    """After the first draw mu moves by eta times the drawn token's surprise error: the second
    step's candidates are the ones that new mu keeps."""
    body = {"prompt": PRINT, "mirostat": version, "mirostat_tau": TAU, "mirostat_eta": ETA,
            "temperature": 1.0}
    steps = served(client, body, n_predict=2)
    assert len(steps) == 2
    state = State()
    first = expected(model, vocab, body, state)
    assert distance(candidates(steps[0]), first) <= TOLERANCE
    drawn = steps[0]["id"]
    surprise = -math.log2(dict(first)[drawn])
    state.mu = state.mu - ETA * (surprise - TAU)
    second = expected(model, vocab, body, state, after=(drawn,))
    assert distance(candidates(steps[1]), second) <= TOLERANCE
    unmoved = expected(model, vocab, body, State(mu=2 * TAU), after=(drawn,))
    assert distance(unmoved, second) > 50 * TOLERANCE


ADAPTIVE = {"prompt": SELF, "samplers": ["top_k", "adaptive_p"], "top_k": 20,
            "adaptive_target": 0.3, "adaptive_decay": 0.5}


def test_adaptive_p_shapes_the_draw_around_the_target(client, model, vocab):
    check(client, model, vocab, ADAPTIVE)
    elsewhere = expected(model, vocab, {**ADAPTIVE, "adaptive_target": 0.05})
    assert distance(elsewhere, expected(model, vocab, ADAPTIVE)) > 50 * TOLERANCE


def test_adaptive_decay_weights_the_history(client, model, vocab):
    """The second step's target is 2 x target - the decayed average of the drawn tokens'
    original probabilities, the first draw's included with weight 1."""
    steps = served(client, ADAPTIVE, n_predict=2)
    assert len(steps) == 2
    state = State()
    assert distance(candidates(steps[0]), expected(model, vocab, ADAPTIVE, state)) <= TOLERANCE
    drawn = steps[0]["id"]
    state.ema_sum = state.notes["original"][drawn] + 0.5 * state.ema_sum
    state.ema_weight = 1 + 0.5 * state.ema_weight
    second = expected(model, vocab, ADAPTIVE, state, after=(drawn,))
    assert distance(candidates(steps[1]), second) <= TOLERANCE


# ---- infill ----------------------------------------------------------------------------------
INFILL = {
    "text": {"prompt": "    for i in range(", "top_k": 40, "temperature": 1.0,
             "samplers": ["top_k", "infill", "temperature"]},
    "end_of_generation": {"prompt": END, "top_k": 40, "temperature": 1.0,
                          "samplers": ["top_k", "infill", "temperature"]},
    "end_of_text": {"prompt": PRINT, "top_k": 12, "temperature": 4.0,
                    "samplers": ["top_k", "temperature", "infill"]},
}


@pytest.mark.parametrize("branch", list(INFILL))
def test_infill_sampler(client, model, vocab, branch):
    """Each of its three outcomes: text tokens merged by common prefix and thresholded, the
    end-of-generation tokens alone, the end of text alone."""
    state = check(client, model, vocab, INFILL[branch])
    assert state.notes["infill"] == branch.replace("_", " ") or (
        branch == "end_of_generation" and state.notes["infill"] == "end of generation only")
    if branch == "text":
        assert state.notes["merged"] > 0


def test_ignore_eos_bans_the_end_of_generation(client, model, vocab):
    """The end-of-generation tokens get -inf (echoed with a null bias) before the chain."""
    body = {"prompt": END, "temperature": 1.0, "ignore_eos": True}
    eos = vocab[0].hf.eos_token_id
    want = expected(model, vocab, {**body, "logit_bias": [[eos, False]]})
    assert distance(candidates(served(client, body)[0]), want) <= TOLERANCE
    plain = expected(model, vocab, {**body, "ignore_eos": False})
    assert dict(plain)[eos] > 0.1 and eos not in dict(want)
    settings = client.post("/completion", json={**body, "n_predict": 1}).json()[
        "generation_settings"]
    assert settings["logit_bias"] == [{"bias": None, "token": eos}]
