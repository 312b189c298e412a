"""Constrained decoding: json_schema and GBNF on /completion (HTTP, stream and not), the
reference's errors and echo, and grammar-constrained sequences sharing a batch in the engine."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from deployments.api.schema import CompletionParams, ParseContext, parse_completion
from engine import aio
from engine.types import ErrorEvent, FinalEvent, GenerationRequest, SamplingParams, TokenEvent

from ..conftest import batch_sizes, run_engine, running_engine
from .test_http import PROMPTS, sse_events

SCHEMA = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
YES_NO = 'root ::= "yes" | "no"'


def valid_n(content: str) -> bool:
    value = json.loads(content)
    return (isinstance(value, dict) and set(value) == {"n"} and isinstance(value["n"], int)
            and not isinstance(value["n"], bool))


async def _complete(client: httpx.AsyncClient, body: dict) -> tuple[int, dict | list]:
    if not body.get("stream"):
        r = await client.post("/completion", json=body)
        return r.status_code, r.json()
    async with client.stream("POST", "/completion", json=body) as r:
        text = (await r.aread()).decode()
    if not r.headers["content-type"].startswith("text/event-stream"):
        return r.status_code, json.loads(text)
    return r.status_code, sse_events(text)


def complete_all(base_url: str, bodies: list[dict]) -> list[tuple[int, dict | list]]:
    async def main():
        async with httpx.AsyncClient(base_url=base_url, timeout=120) as client:
            return await asyncio.gather(*[_complete(client, b) for b in bodies])

    return asyncio.run(main())


def content_of(result: dict | list) -> str:
    if isinstance(result, list):  # stream: the partials carry the text
        assert result[-1]["stop"] is True and result[-1]["stop_type"] == "eos"
        return "".join(e["content"] for e in result)
    assert result["stop_type"] == "eos"
    return result["content"]


@pytest.mark.parametrize("stream", [False, True])
def test_json_schema_validates_for_20_seeds(base_url, stream):
    bodies = [{"prompt": PROMPTS[seed % len(PROMPTS)], "json_schema": SCHEMA, "seed": seed,
               "temperature": 1.0, "n_predict": 48, "stream": stream} for seed in range(20)]
    results = complete_all(base_url, bodies)
    assert [status for status, _ in results] == [200] * 20
    contents = [content_of(result) for _, result in results]
    assert all(valid_n(c) for c in contents), contents


@pytest.mark.parametrize("stream", [False, True])
def test_gbnf_yes_or_no(base_url, stream):
    bodies = [{"prompt": PROMPTS[seed % len(PROMPTS)], "grammar": YES_NO, "seed": seed,
               "temperature": 1.0, "n_predict": 16, "stream": stream} for seed in range(8)]
    results = complete_all(base_url, bodies)
    assert [status for status, _ in results] == [200] * 8
    assert {content_of(result) for _, result in results} <= {"yes", "no"}


def test_generation_settings_echo_the_grammar(client):
    body = {"prompt": "x = ", "n_predict": 48, "temperature": 0}
    gbnf = client.post("/completion", json={**body, "grammar": YES_NO}).json()
    assert gbnf["generation_settings"]["grammar"] == YES_NO
    schema = client.post("/completion", json={**body, "json_schema": SCHEMA}).json()
    echoed = schema["generation_settings"]["grammar"]
    assert echoed.startswith("%llguidance {}\nstart: %json ")
    # the echo is itself a grammar: sent back, it constrains the same way
    again = client.post("/completion", json={**body, "grammar": echoed}).json()
    assert again["content"] == schema["content"] and valid_n(again["content"])


def test_grammar_wins_over_json_schema(client):
    r = client.post("/completion", json={"prompt": "x = ", "n_predict": 8, "temperature": 0,
                                         "json_schema": SCHEMA, "grammar": 'root ::= "qq"'})
    assert r.status_code == 200
    assert r.json()["content"] == "qq"
    assert r.json()["generation_settings"]["grammar"] == 'root ::= "qq"'


@pytest.mark.parametrize("stream", [False, True])
def test_invalid_gbnf_is_refused_before_generation(client, stream):
    r = client.post("/completion", json={"prompt": "x", "grammar": "root ::= nope",
                                         "stream": stream})
    assert r.status_code == 400
    assert r.headers["content-type"].startswith("application/json")
    assert r.json() == {"error": {"code": 400, "type": "invalid_request_error",
                                  "message": "Failed to initialize samplers: failed to parse "
                                             "grammar"}}


def test_generation_prompt_prefills_a_json_schema_grammar(client):
    """An output-format grammar (from json_schema) accepts the generation prompt's tokens first
    (common_grammar_needs_prefill); a client's grammar string is never prefilled."""
    digit = {**SCHEMA, "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 9}}}
    body = {"prompt": "x = ", "n_predict": 16, "temperature": 0, "json_schema": digit}
    plain = client.post("/completion", json=body).json()["content"]
    r = client.post("/completion", json={**body, "generation_prompt": '{"n": '})
    assert r.status_code == 200
    assert valid_n(plain) and valid_n('{"n": ' + r.json()["content"])
    assert plain.startswith("{") and not r.json()["content"].startswith("{")
    # a prompt the grammar does not accept fails the sampler initialization, before any frame
    [x] = client.post("/tokenize", json={"content": "x"}).json()["tokens"]
    r = client.post("/completion", json={**body, "generation_prompt": "x", "stream": True})
    assert r.status_code == 400 and r.json()["error"] == {
        "code": 400, "type": "invalid_request_error",
        "message": "Failed to initialize samplers: Unexpected empty grammar stack after "
                   f"accepting piece: x ({x})"}
    r = client.post("/completion", json={**body, "json_schema": None, "grammar": YES_NO,
                                         "generation_prompt": "x"})
    assert r.status_code == 200 and r.json()["content"] in ("yes", "no")

def test_unconvertible_json_schema_names_the_field(client):
    r = client.post("/completion", json={"prompt": "x", "json_schema": {"type": "nonsense-type"}})
    assert r.status_code == 400
    assert r.json()["error"]["message"] == (
        "Field 'json_schema': \"json_schema\": JSON schema conversion failed:\n"
        'Unrecognized schema: {"type":"nonsense-type"}')


def test_schema_resolution_rules():
    defaults = CompletionParams()
    ctx = ParseContext()
    assert parse_completion({"grammar": {"type": "object"}}, ctx, defaults).grammar == ""
    assert parse_completion({"grammar": YES_NO}, ctx, defaults).grammar == YES_NO
    assert parse_completion({"json_schema": SCHEMA, "grammar": YES_NO}, ctx,
                            defaults).grammar == YES_NO
    assert "%json" in parse_completion({"json_schema": SCHEMA}, ctx, defaults).grammar


# ---- the OpenAI chat route: response_format becomes the native json_schema ----------------
def chat_all(base_url: str, bodies: list[dict]) -> list[tuple[int, str, str]]:
    """(status, content, finish_reason) per body, streamed or not."""
    async def one(client: httpx.AsyncClient, body: dict) -> tuple[int, str, str]:
        if not body.get("stream"):
            r = await client.post("/v1/chat/completions", json=body)
            choice = r.json()["choices"][0] if r.status_code == 200 else {}
            return r.status_code, choice.get("message", {}).get("content"), choice.get(
                "finish_reason")
        async with client.stream("POST", "/v1/chat/completions", json=body) as r:
            text = (await r.aread()).decode()
        frames = [json.loads(line[6:]) for line in text.splitlines()
                  if line.startswith("data: ") and line != "data: [DONE]"]
        choices = [f["choices"][0] for f in frames if f.get("choices")]
        content = "".join(c["delta"].get("content") or "" for c in choices)
        return r.status_code, content, choices[-1]["finish_reason"]

    async def main():
        async with httpx.AsyncClient(base_url=base_url, timeout=120) as client:
            return await asyncio.gather(*[one(client, b) for b in bodies])

    return asyncio.run(main())


@pytest.mark.parametrize("stream", [False, True])
def test_chat_response_format(base_url, stream):
    """json_schema and json_object (with its schema) on /v1/chat/completions constrain the
    content, streamed or not, for several seeds at temperature 1."""
    messages = [{"role": "user", "content": "Give me n as JSON."}]
    formats = [{"type": "json_schema", "json_schema": {"name": "n", "schema": SCHEMA}},
               {"type": "json_object", "schema": SCHEMA}]
    bodies = [{"messages": messages, "response_format": formats[seed % 2], "seed": seed,
               "temperature": 1.0, "max_tokens": 48, "stream": stream} for seed in range(8)]
    results = chat_all(base_url, bodies)
    assert [(status, finish) for status, _, finish in results] == [(200, "stop")] * 8
    assert all(valid_n(content) for _, content, _ in results)


def test_chat_response_format_unknown_type_is_refused(client):
    r = client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}],
                                                  "response_format": {"type": "yaml"}})
    assert r.status_code == 400
    assert r.json()["error"]["message"] == ('response_format type must be one of "text" or '
                                            '"json_object", but got: yaml')


# ---- the engine: constrained and free sequences in one batch --------------------------------
@pytest.fixture(scope="module")
def engine():
    yield from running_engine(8)


run = run_engine


def test_half_constrained_batch_decodes_together(engine):
    """Eight sequences, four under a grammar, admitted at once: every decode step carries all
    eight until the short constrained ones end, free ones match their greedy output alone, and
    the grammar compiles once."""
    schema = parse_completion({"json_schema": SCHEMA}, ParseContext(), CompletionParams()).grammar
    prompts = [engine.vocab.tokenize(p, add_special=True) for p in PROMPTS]

    def request(i: int, grammar: str) -> GenerationRequest:
        sampling = SamplingParams(temperature=1.0 if grammar else 0.0, seed=i)
        return GenerationRequest(prompts[i], sampling, n_predict=24, grammar=grammar,
                                 stream=True, index=i)

    alone = [run(engine, request(i, "")) for i in range(1, 8, 2)]
    compiles = engine.grammars.compiles
    with batch_sizes(engine) as steps:
        events = run(engine, *[request(i, schema if i % 2 == 0 else "") for i in range(8)])
    assert engine.grammars.compiles == compiles + 1
    assert max(steps) == 8
    finals = {e.index: e for e in events if isinstance(e, FinalEvent)}
    assert all(valid_n(finals[i].content) for i in range(0, 8, 2))
    for i, solo in zip(range(1, 8, 2), alone):
        assert finals[i].tokens == next(e for e in solo if isinstance(e, FinalEvent)).tokens
    order = [e.index for e in events if isinstance(e, TokenEvent)]
    assert order.index(1) < max(j for j, x in enumerate(order) if x == 0)


def test_eos_only_when_the_grammar_accepts(engine):
    """The mask admits EOS only once the grammar accepts, and nothing else once it is complete;
    a second processor for the same grammar reuses the compiled template."""
    vocab = engine.vocab
    eos = sorted(vocab.eog_ids)
    compiles = engine.grammars.compiles
    processor = engine.grammars.processor('root ::= "ab" "c"?')
    assert engine.grammars.processor('root ::= "ab" "c"?') is not processor
    assert engine.grammars.compiles == compiles + 1
    assert not processor.allowed()[eos].any()
    assert processor.matcher.consume_tokens(vocab.tokenize("ab", add_special=False))
    allowed = processor.allowed()
    assert allowed[eos].all() and allowed.sum() > len(eos)  # "c" may still come
    assert processor.matcher.consume_tokens(vocab.tokenize("c", add_special=False))
    assert set(processor.allowed().nonzero()[0]) == set(eos)


def test_grammar_dead_end_fails_that_sequence_alone(engine):
    """Every token the grammar allows is banned (EOS after "yes"): that request ends with an
    error event; another request decoding in the same batch completes."""
    eos = sorted(engine.vocab.eog_ids)
    banned = SamplingParams(temperature=0.0, logit_bias=[(t, None) for t in eos])
    prompt = engine.vocab.tokenize("x = ", add_special=True)
    dead_end = GenerationRequest(prompt, banned, n_predict=8, grammar='root ::= "yes"')
    free = GenerationRequest(prompt, SamplingParams(temperature=0.0), n_predict=8)

    async def both():
        async def collect(request):
            return [e async for batch in aio.generate(engine, [request]) for e in batch]

        return await asyncio.gather(collect(dead_end), collect(free))

    failed, completed = asyncio.run(both())
    assert isinstance(failed[-1], ErrorEvent) and failed[-1].code == 500
    assert "does not match the grammar" in failed[-1].message
    assert isinstance(completed[-1], FinalEvent) and completed[-1].stop_type in ("limit", "eos")


def test_a_new_grammar_compiles_off_the_event_loop(engine, monkeypatch):
    """Compiling takes a while for a large vocabulary: on the replica's event loop it would stall
    every other stream there; it runs in a worker thread, and the loop's own submit then finds it
    compiled."""
    import threading

    from engine import grammar

    compiled_on: list[int] = []
    real = grammar.to_lark

    def recording(text: str) -> str:
        compiled_on.append(threading.get_ident())
        return real(text)

    monkeypatch.setattr(grammar, "to_lark", recording)

    async def run() -> int:
        request = GenerationRequest(engine.vocab.tokenize("x = ", add_special=True),
                                    SamplingParams(temperature=0.0), n_predict=16,
                                    grammar='root ::= "off" " the loop"')
        events = [e async for batch in aio.generate(engine, [request]) for e in batch]
        assert isinstance(events[-1], FinalEvent) and events[-1].content == "off the loop"
        return threading.get_ident()

    loop_thread = asyncio.run(run())
    assert compiled_on and loop_thread not in compiled_on
