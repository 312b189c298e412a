"""Every native /completion field of b10621, table-driven: honored (its effect on real output),
refused (a 400 naming it) or inert (the same output with and without it). Fields whose effect
is a response shape are proven by a capture replay or a focused test, named in the table."""

from __future__ import annotations

import importlib
import json
from dataclasses import dataclass, field

import pytest

from deployments.api.schema import FIELDS, SPECULATIVE_KEYS

from ..captures import load_captures
from ..conftest import CAPTURES, MODEL

BASE = {"prompt": "def main():\n", "n_predict": 16, "cache_prompt": False, "seed": 42,
        "temperature": 1.5}
GREEDY = {"temperature": 0}
REPEATS = {"prompt": "x = 1\nx = 1\nx = 1\nx = 1\nx = 1\nx = 1\n", "temperature": 0}
DRY_ON = {**REPEATS, "dry_multiplier": 1.0, "dry_sequence_breakers": ["@"]}
MIROSTAT = {"mirostat": 2, "temperature": 3.0}
ADAPTIVE = {"samplers": ["top_k", "adaptive_p"]}
WARM = {"temperature": 0.8}  # hotter, the tiny model soon emits invalid UTF-8 (a 500 by the rules)
FIRST_GREEDY_TOKEN = 260  # "def main():\n" greedily continues with this token in the fixture model
EOS = 1
# "def main():\n" greedily continues with "    return codecs.CodecInfo(\n": " return" opens it
BUDGET = {**GREEDY, "prompt": "def main():\n", "n_predict": 16, "cache_prompt": False,
          "reasoning_budget_start_tag": " return", "reasoning_budget_end_tags": ["\n"],
          "reasoning_budget_message": " None"}
BUDGET_PROOF = "test_reasoning_budget_forces_the_end_on_real_output"


@dataclass(frozen=True)
class Case:
    policy: str  # honored, inert, refused
    body: dict  # what the request adds
    base: dict = field(default_factory=dict)  # sent with and without the field
    proof: str = "differs"  # differs | same | refused | capture:<name> | test:<function>


def case(policy: str, body: dict, base: dict | None = None, proof: str | None = None) -> Case:
    default = {"honored": "differs", "inert": "same", "refused": "refused"}[policy]
    return Case(policy, body, base or {}, proof or default)


TABLE: dict[str, Case] = {
    # output and transport
    "verbose": case("inert", {"verbose": True}),
    "timings_per_token": case("honored", {}, proof="capture:stream_timings_per_token"),
    "stream": case("honored", {}, proof="capture:stream_basic"),
    "stream_options": case("inert", {"stream_options": {"unknown": 1}}),
    "include_usage": case("inert", {"stream_options": {"include_usage": True}}),
    "cache_prompt": case("honored", {}, proof="capture:cache_repeat"),
    "return_tokens": case("honored", {}, proof="capture:return_tokens"),
    "return_progress": case("honored", {}, proof="capture:stream_progress"),
    "sse_ping_interval": case("honored", {},
                              proof="test:compat.test_compat.test_sse_ping_after_silence"),
    "n_predict": case("honored", {"n_predict": 3}),
    "n_indent": case("honored", {}, proof="test:test_n_indent_stops_on_real_output"),
    "n_keep": case("inert", {"n_keep": 4}),
    "n_discard": case("inert", {"n_discard": 3}),
    "n_cmpl": case("honored", {}, proof="test:test_n_cmpl_4_returns_4_results"),
    "n_cache_reuse": case("refused", {"n_cache_reuse": 256}),
    "t_max_predict_ms": case("honored", {}, proof="test:test_t_max_predict_ms_stops_at_a_newline"),
    "response_fields": case("honored", {}, proof="capture:response_fields_two"),
    # sampling
    "top_k": case("honored", {"top_k": 1}),
    "top_p": case("honored", {"top_p": 0.1}),
    "min_p": case("honored", {"min_p": 0.6}),
    "top_n_sigma": case("honored", {"top_n_sigma": 0.5}),
    "xtc_probability": case("honored", {"xtc_probability": 1.0}, GREEDY | {"samplers": "xt"}),
    "xtc_threshold": case("honored", {"xtc_threshold": 0.01},
                          {"xtc_probability": 1.0, "min_p": 0.0}),
    "typical_p": case("honored", {"typical_p": 0.3}, WARM),
    "temperature": case("honored", {"temperature": 0.0}),
    "dynatemp_range": case("honored", {"dynatemp_range": 0.7}, WARM),
    "dynatemp_exponent": case("honored", {"dynatemp_exponent": 3.0},
                              WARM | {"dynatemp_range": 0.7}),
    "repeat_last_n": case("honored", {"repeat_last_n": 0}, REPEATS | {"repeat_penalty": 3.0}),
    "repeat_penalty": case("honored", {"repeat_penalty": 3.0}, REPEATS),
    "frequency_penalty": case("honored", {"frequency_penalty": 2.0}, REPEATS),
    "presence_penalty": case("honored", {"presence_penalty": 2.0}, REPEATS),
    "dry_multiplier": case("honored", {"dry_multiplier": 1.0},
                           REPEATS | {"dry_sequence_breakers": ["@"]}),
    "dry_base": case("honored", {"dry_base": 4.0}, DRY_ON | {"dry_multiplier": 0.1}),
    "dry_allowed_length": case("honored", {"dry_allowed_length": 8}, DRY_ON),
    "dry_penalty_last_n": case("honored", {"dry_penalty_last_n": 3}, DRY_ON),
    "dry_sequence_breakers": case("honored", {"dry_sequence_breakers": ["\n"]}, DRY_ON),
    "mirostat": case("honored", {"mirostat": 2}, {"temperature": 3.0}),
    "mirostat_tau": case("honored", {"mirostat_tau": 1.0}, MIROSTAT),
    "mirostat_eta": case("honored", {"mirostat_eta": 1.0}, MIROSTAT | {"mirostat_tau": 2.0}),
    "adaptive_target": case("honored", {"adaptive_target": 0.3}, ADAPTIVE),
    "adaptive_decay": case("honored", {"adaptive_decay": 0.0}, ADAPTIVE | {"adaptive_target": 0.3}),
    "seed": case("honored", {}, proof="test:test_seed_determinism_over_http"),
    "n_probs": case("honored", {}, proof="capture:n_probs_3"),
    "min_keep": case("honored", {"min_keep": 30}, {"min_p": 0.9}),
    "backend_sampling": case("inert", {"backend_sampling": True}),
    "post_sampling_probs": case("honored", {}, proof="test:test_post_sampling_probs"),
    "lora": case("honored", {}, proof="test:serve.test_adapters_http."
                                      "test_lora_ids_pick_adapters_and_scale_zero_is_the_base"),
    "logit_bias": case("honored", {"logit_bias": [[FIRST_GREEDY_TOKEN, False]]}, GREEDY),
    "ignore_eos": case("honored", {"ignore_eos": True}, {"logit_bias": [[EOS, 30.0]]}),
    "stop": case("honored", {}, proof="capture:stop_newline"),
    "samplers": case("honored", {"samplers": ["top_k", "min_p"]}),
    # grammar: honored (tests/serve/test_grammar.py, tests/api/test_lazy_grammar.py)
    "json_schema": case("honored", {},
                        proof="test:serve.test_grammar.test_json_schema_validates_for_20_seeds"),
    "grammar_lazy": case(
        "honored", {},
        proof="test:api.test_lazy_grammar.test_trigger_switches_the_grammar_on_exactly_there"),
    "grammar_triggers": case(
        "honored", {},
        proof="test:api.test_lazy_grammar.test_trigger_switches_the_grammar_on_exactly_there"),
    "preserved_tokens": case(
        "honored", {}, proof="test:api.test_lazy_grammar.test_preserved_token_is_rendered_as_text"),
    # chat templates and reasoning: inert on the native route but for the reasoning budget
    "chat_format": case("inert", {"chat_format": 1}),
    "reasoning_format": case("inert", {"reasoning_format": "none"}),
    "generation_prompt": case("honored", {},
                              proof="test:test_generation_prompt_is_the_budgets_prefill"),
    "parse_tool_calls": case("inert", {"parse_tool_calls": True}),
    "chat_parser": case("inert", {"chat_parser": "x"}),
    "continue_final_message": case("inert", {"continue_final_message": True}),
    "echo": case("inert", {"echo": True}),
    "reasoning_control": case("honored", {}, proof="test:serve.test_control."
                                                   "test_reasoning_end_forces_the_budget_end"),
    "reasoning_budget_tokens": case("honored", {}, proof=f"test:{BUDGET_PROOF}"),
    "reasoning_budget_start_tag": case("honored", {}, proof=f"test:{BUDGET_PROOF}"),
    "reasoning_budget_end_tags": case("honored", {},
                                      proof="test:test_reasoning_budget_end_tag_ends_it_first"),
    "reasoning_budget_message": case("honored", {}, proof=f"test:{BUDGET_PROOF}"),
    **{key: case("inert", {key: 4}) for key in SPECULATIVE_KEYS},
}


def by_proof(kind: str) -> list[str]:
    return [name for name, c in TABLE.items() if c.proof.split(":")[0] == kind]


def complete(client, body: dict) -> dict:
    r = client.post("/completion", json={**BASE, "return_tokens": True, **body})
    assert r.status_code == 200, r.text
    return r.json()


def test_the_table_is_the_74_fields_with_the_schema_policies():
    expected = [f.name for f in FIELDS] + ["stream_options", *SPECULATIVE_KEYS]
    assert sorted(TABLE) == sorted(expected) and len(TABLE) == 74
    for spec in FIELDS:
        assert TABLE[spec.name].policy == spec.policy, spec.name


@pytest.mark.parametrize("name", by_proof("refused"))
def test_refused_field_is_a_400_naming_it(client, name):
    r = client.post("/completion", json={**BASE, **TABLE[name].body})
    assert r.status_code == 400
    error = r.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert error["message"].startswith(f"Field '{name}': not supported by mlxray")


@pytest.mark.parametrize("name", by_proof("same"))
def test_inert_field_changes_nothing(client, name):
    without = complete(client, {})
    with_it = complete(client, TABLE[name].body)
    assert (with_it["content"], with_it["tokens"]) == (without["content"], without["tokens"])


@pytest.mark.parametrize("name", by_proof("differs"))
def test_honored_field_changes_the_output(client, name):
    c = TABLE[name]
    without = complete(client, c.base)
    with_it = complete(client, {**c.base, **c.body})
    assert with_it["tokens"] != without["tokens"]
    settings = with_it["generation_settings"]
    for key, value in c.body.items():
        if key in settings and isinstance(value, (int, float)) and not isinstance(value, bool):
            assert settings[key] == pytest.approx(value, rel=1e-6), key


@pytest.mark.parametrize("name", by_proof("capture") + by_proof("test"))
def test_named_proof_exists(name):
    kind, target = TABLE[name].proof.split(":")
    if kind == "capture":
        names = {c["probe"]["name"] for c in load_captures(CAPTURES)}
        assert target in names  # replayed by tests/serve/test_conformance.py
    else:
        module, _, function = target.rpartition(".")
        scope = vars(importlib.import_module(f"tests.{module}")) if module else globals()
        assert callable(scope.get(function)), target


# ---- focused tests --------------------------------------------------------------------------
def sse_events(text: str) -> list:
    return [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: ")]


def test_n_cmpl_4_returns_4_results(client):
    results = client.post("/completion", json={**BASE, "n_cmpl": 4}).json()
    assert [r["index"] for r in results] == [0, 1, 2, 3]
    assert len({r["content"] for r in results}) > 1  # seeds 42..45
    # the children share the parent's evaluated prompt: the same prompt timings
    prompt_timings = {(r["timings"]["cache_n"], r["timings"]["prompt_n"], r["timings"]["prompt_ms"])
                      for r in results}
    assert len(prompt_timings) == 1


def test_n_cmpl_2_stream_interleaves_by_index(client):
    with client.stream("POST", "/completion", json={**BASE, "n_cmpl": 2, "stream": True}) as r:
        events = sse_events(r.read().decode())
    order = [e["index"] for e in events if not e["stop"]]
    assert set(order) == {0, 1}
    assert order.index(1) < len(order) - 1 - order[::-1].index(0)  # 1 starts before 0 ends
    assert sorted(e["index"] for e in events if e["stop"]) == [0, 1]


def test_later_prompts_start_with_data_null(client):
    body = {**BASE, "prompt": ["def main():\n", "import os\n", "x = 1\n"], "stream": True,
            "n_predict": 3}
    with client.stream("POST", "/completion", json=body) as r:
        raw = r.read().decode()
    assert raw.count("data: null\n\n") == 2
    assert raw.startswith("data: null\n\n")
    finals = [e for e in sse_events(raw) if e is not None and e["stop"]]
    assert sorted(e["index"] for e in finals) == [0, 1, 2]


def test_n_indent_stops_on_real_output(client):
    body = {**GREEDY, "prompt": "def f(x):\n    if x:\n", "n_predict": 64, "cache_prompt": False}
    plain = client.post("/completion", json=body).json()
    cut = client.post("/completion", json={**body, "n_indent": 8}).json()
    # the first line indented less than 8 ends the generation just before its first character
    assert plain["content"].startswith("        return None\n    ")
    assert cut["content"] == "        return None\n    "
    assert cut["stop_type"] == "limit" and not cut["truncated"]
    with client.stream("POST", "/completion", json={**body, "n_indent": 8, "stream": True}) as r:
        events = sse_events(r.read().decode())
    sent = "".join(e["content"] for e in events if not e["stop"])
    assert sent.startswith(cut["content"]) and len(sent) > len(cut["content"])  # already sent


def test_t_max_predict_ms_stops_at_a_newline(client):
    body = {**GREEDY, "prompt": "    for i in range(", "n_predict": 128, "cache_prompt": False}
    plain = client.post("/completion", json=body).json()
    limited = client.post("/completion", json={**body, "t_max_predict_ms": 1}).json()
    first_line = plain["content"][: plain["content"].index("\n") + 1]
    assert limited["content"] == first_line  # the newline-bearing token is kept
    assert limited["stop_type"] == "limit" and limited["tokens_predicted"] < 128


def test_seed_determinism_over_http(client):
    def run(seed: int) -> str:
        return client.post("/completion", json={**BASE, "seed": seed}).json()["content"]

    assert run(7) == run(7)
    assert run(7) != run(8)


def test_post_sampling_probs(client):
    body = {**BASE, "n_probs": 10, "post_sampling_probs": True, "temperature": 1.0,
            "min_p": 0.0}
    probs = client.post("/completion", json=body).json()["completion_probabilities"]
    for step in probs:
        assert set(step) == {"id", "token", "bytes", "prob", "top_probs"}
        values = [c["prob"] for c in step["top_probs"]]
        assert all(0 < v <= 1 for v in values) and values == sorted(values, reverse=True)
        assert len(values) == 10 or sum(values) == pytest.approx(1.0, abs=1e-4)
        assert 0 < step["prob"] <= 1
    greedy = client.post("/completion", json={**body, **GREEDY}).json()
    first = greedy["completion_probabilities"][0]
    assert first["prob"] == 1.0 and [c["prob"] for c in first["top_probs"]] == [1.0]


def test_cases_are_real():
    """Guards the table: every value a case sends parses to something else than the schema's
    default for that field (with the case's base sent both times), so "differs" and "same" are
    about the field; a refused field's value is refused."""
    from deployments.api.schema import CompletionParams, ParseContext, parse_completion
    from engine.vocab import load_vocab

    vocab = load_vocab(MODEL)
    ctx = ParseContext(tokenize=lambda text: vocab.tokenize(text, False), n_vocab=vocab.n_vocab,
                       eog_ids=tuple(sorted(vocab.eog_ids)))
    by_key = {(f.parent, k): f for f in FIELDS for k in f.keys}
    for name, c in TABLE.items():
        if c.proof not in ("differs", "same", "refused"):
            continue
        base = {"prompt": "x", **BASE, **c.base}
        if c.policy == "refused":
            with pytest.raises(Exception, match=f"Field '{name}'"):
                parse_completion({**base, **c.body}, ctx, CompletionParams())
            continue
        sent = parse_completion({**base, **c.body}, ctx, CompletionParams())
        unsent = parse_completion(base, ctx, CompletionParams())
        for key, value in c.body.items():
            nested = value.items() if isinstance(value, dict) else [(None, value)]
            for inner, _ in nested:
                spec = by_key.get((key, inner)) if inner else by_key.get(("", key))
                if spec is None:
                    assert key in SPECULATIVE_KEYS or (key, inner) == ("stream_options", "unknown")
                    continue
                assert getattr(sent, spec.target) != getattr(unsent, spec.target), (name, key)



# ---- the reasoning budget (engine/reasoning_budget.py) on real output: greedy, so exact ----
def test_reasoning_budget_forces_the_end_on_real_output(client):
    plain = complete(client, {**BUDGET, "reasoning_budget_tokens": -1})  # the default: no budget
    assert plain["content"].startswith("    return codecs.CodecInfo(\n")
    # " code", "c", "s" spend a budget of 3, then the message and the first end tag are forced
    three = complete(client, {**BUDGET, "reasoning_budget_tokens": 3})
    forced = [client.post("/tokenize", json={"content": text}).json()["tokens"]
              for text in (" None", "\n")]
    assert three["tokens"][:7] == plain["tokens"][:5] + forced[0] + forced[1]
    assert three["content"].startswith("    return codecs None\n")
    assert complete(client, {**BUDGET, "reasoning_budget_tokens": 0})["content"].startswith(
        "    return None\n")
    # an empty message (or one that is not a string) forces the end tag alone; without a message
    # nothing is forced: only its handler sets the forced tokens in the reference
    for message in ("", 5):
        bare = complete(client, {**BUDGET, "reasoning_budget_tokens": 3,
                                 "reasoning_budget_message": message})
        assert bare["content"].startswith("    return codecs\n")
    unsent = {**BUDGET, "reasoning_budget_tokens": 3, "reasoning_budget_message": None}
    assert complete(client, unsent)["tokens"] == plain["tokens"]


def test_reasoning_budget_end_tag_ends_it_first(client):
    body = {**BUDGET, "reasoning_budget_end_tags": ["\n", "("]}
    plain = complete(client, {**body, "reasoning_budget_tokens": -1})
    # "(" is the 10th token after " return": a budget of 10 ends on it (the tag is not counted),
    # one of 9 is spent first and forces the first end tag
    assert complete(client, {**body, "reasoning_budget_tokens": 10})["tokens"] == plain["tokens"]
    assert complete(client, {**body, "reasoning_budget_tokens": 9})["content"].startswith(
        "    return codecs.CodecInfo None\n")
    # the alias is one tag; a null reasoning_budget_end_tags still hides it (no end tag: no budget)
    alias = {**BUDGET, "reasoning_budget_end_tags": None, "reasoning_budget_end_tag": "(",
             "reasoning_budget_tokens": 9}
    assert complete(client, alias)["tokens"] == plain["tokens"]
    del alias["reasoning_budget_end_tags"]
    assert complete(client, alias)["content"].startswith("    return codecs.CodecInfo None(")


def test_generation_prompt_is_the_budgets_prefill(client):
    # its tokens are accepted before the first generated one: holding the start tag, it opens the
    # budget at once, so "    " and " return" spend a budget of 2
    body = {**BUDGET, "reasoning_budget_tokens": 2}
    assert complete(client, body)["content"].startswith("    return codec None\n")
    opened = complete(client, {**body, "generation_prompt": " return"})
    assert opened["content"].startswith("    return None\n")
    assert opened["generation_settings"]["generation_prompt"] == " return"
