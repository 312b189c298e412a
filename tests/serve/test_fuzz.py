"""Bad input never breaks the server: a hypothesis property test and a schemathesis fuzz against
the ingress's OpenAPI document, over /completion(s), /tokenize, /detokenize, /v1/completions and
/v1/chat/completions, on a graph with a 64-token context (any generation ends fast), a 64 KiB
body limit and the tool-calling template, run in the test's process on the real model
(tests/local_graph.py: the graph's own classes, without Ray, whose hops add nothing a fuzz
finds but a few tens of ms a request); and the agents' own requests
(tests/fixtures/agents, recorded from Claude Code and Codex CLI by tests/serve/test_agents.py),
their strings cut to 40 characters to fit the limit, on /v1/messages and /v1/responses.

Random types, nulls, huge numbers, NaN, deep nesting, invalid UTF-8, unpaired surrogates, huge
bodies and token ids out of range: no answer is a 5xx, every non-200 answer carries the error
envelope with its status as code, and the server is healthy and idle afterwards.

MLXRAY_FUZZ_CASES (default 200) is the number of hypothesis cases per kind and of schemathesis's
fuzzing cases per operation and mode; from 1,000 on, schemathesis's coverage phase (boundary
values and wrong types of every field) runs too. The figures in docs/reliability.md were measured
with 1,000 (8,882 requests)."""

from __future__ import annotations

import json
import os
import random
from collections import Counter
from pathlib import Path

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode

from deployments.api.config import GraphArgs
from deployments.api.schema import FIELDS
from deployments.serve import engines
from deployments.serve.ingress import app as ingress_app
from engine.types import BAD_OUTPUT_MESSAGE

from ..local_graph import engine_state, local_graph_parts
from ..reliability import assert_envelope, is_idle
from .mutations import mutate
from .test_tools import LOCAL as TOOLS_ARGS

CASES = int(os.environ.get("MLXRAY_FUZZ_CASES", "200"))
BODY_LIMIT = 64 * 1024
DEFAULT_BODY_LIMIT = GraphArgs.model_fields["max_body_bytes"].default
ROUTES = ["/completion", "/completions", "/tokenize", "/detokenize", "/v1/completions",
          "/v1/chat/completions"]
STATUSES: dict[str, Counter] = {}

FUZZ = settings(max_examples=CASES, deadline=None, derandomize=True, database=None,
                suppress_health_check=list(HealthCheck))


@pytest.fixture(scope="module")
def fuzz_graph():
    args = {"n_parallel": 4, "n_ctx": 64, "max_body_bytes": BODY_LIMIT,
            "chat_template_file": "models/tiny-python-tools.jinja"}
    with local_graph_parts(args, engines.mlx_engine) as parts:
        yield parts
        for kind, statuses in STATUSES.items():
            n = sum(v for k, v in statuses.items() if isinstance(k, int))
            print(f"\n{kind}: {n} requests, by status {dict(statuses)}")


@pytest.fixture(scope="module")
def http(fuzz_graph) -> httpx.Client:
    return fuzz_graph[0]


def check_answer(kind: str, status: int, body: bytes) -> None:
    """No 5xx, and the envelope on every non-200. The one 500 allowed is the reference's own
    answer to generated text that is not valid UTF-8 (its chat parser refuses it): it is about
    the model's output, which random sampling settings on a byte-level vocabulary can produce."""
    STATUSES.setdefault(kind, Counter())[status] += 1
    if status != 200:
        error = assert_envelope(status, body)
        if status == 500 and error["message"] == BAD_OUTPUT_MESSAGE:
            STATUSES[kind]["500 (invalid UTF-8 output, as the reference)"] += 1
            return
    assert status < 500, body[:300]


def post(kind: str, http: httpx.Client, route: str, content: bytes) -> None:
    r = http.post(route, content=content, headers={"content-type": "application/json"})
    check_answer(kind, r.status_code, r.content)


# ---- hypothesis ------------------------------------------------------------------------------
scalars = (st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=24)
           | st.integers(min_value=-(2**70), max_value=2**70))
json_values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner,
                                                                max_size=4),
    max_leaves=10,
)
known_keys = sorted({k for f in FIELDS for k in f.keys} | {
    "prompt", "content", "tokens", "add_special", "parse_special", "with_pieces", "n_cmpl",
})
token_ids = st.lists(st.integers(min_value=-10, max_value=10**12) | st.just(2**63), max_size=6)
messages = st.lists(st.fixed_dictionaries(
    {"role": st.sampled_from(["system", "user", "assistant", "tool", "nobody"]) | json_values},
    optional={"content": st.text(max_size=30) | json_values}), max_size=3)
bodies = st.fixed_dictionaries(
    {"prompt": st.text(max_size=40) | token_ids | json_values},
    optional={"content": json_values, "tokens": token_ids | json_values,
              "messages": messages | json_values, "model": json_values},
) .flatmap(lambda base: st.dictionaries(st.sampled_from(known_keys), json_values, max_size=5)
           .map(lambda extra: {**base, **extra}))


def encode(value: object) -> bytes:
    return json.dumps(value, allow_nan=True).encode()


@FUZZ
@given(route=st.sampled_from(ROUTES), body=bodies)
def test_random_json_bodies(http, route, body):
    post("hypothesis JSON bodies", http, route, encode(body))


raw_bodies = st.one_of(
    st.binary(max_size=64),
    bodies.map(encode).flatmap(lambda b: st.integers(0, len(b)).map(lambda n: b[:n])),
    bodies.map(encode).flatmap(lambda b: st.binary(min_size=1, max_size=4).map(
        lambda junk: b[:1] + junk + b[1:])),  # invalid UTF-8 inside the JSON
    st.integers(1, 50_000).map(lambda depth: b"[" * depth + b"]" * depth),
    st.integers(1, 50_000).map(lambda depth: b'{"prompt":' + b"[" * depth + b"]" * depth + b"}"),
    st.sampled_from([b'{"prompt":"\\udc80"}', b'{"content":"\\ud800x"}', b'{"prompt":NaN}',
                     b'{"prompt":"x","temperature":Infinity}', b'{"tokens":[1e400]}',
                     b'{"prompt":"x","n_predict":1e400}', b"", b"null", b"[]", b'"x"']),
)


@FUZZ
@given(route=st.sampled_from(ROUTES), content=raw_bodies)
def test_raw_bodies(http, route, content):
    post("hypothesis raw bodies", http, route, content)


# ---- the agents' requests ----------------------------------------------------------------------
AGENTS = Path(__file__).resolve().parents[1] / "fixtures" / "agents"
AGENT_REQUESTS = [json.loads(p.read_text()) for p in sorted(AGENTS.glob("*.json"))
                  if p.name not in ("package.json", "package-lock.json")]


def shortened(value: object) -> object:
    if isinstance(value, str):
        return value[:40]
    if isinstance(value, list):
        return [shortened(v) for v in value]
    if isinstance(value, dict):
        return {k: shortened(v) for k, v in value.items()}
    return value


SEEDS = [(r["path"], shortened(r["body"])) for r in AGENT_REQUESTS]


def test_agent_requests_as_recorded(http):
    """Each seed goes through the protocol's conversion, its tools and the template: what stops
    it is the 64-token context."""
    assert {path for path, _ in SEEDS} == {"/v1/messages", "/v1/responses"}
    for path, body in SEEDS:
        r = http.post(path, content=encode(body), headers={"content-type": "application/json"})
        check_answer("agent requests", r.status_code, r.content)
        assert assert_envelope(400, r.content)["type"] == "exceed_context_size_error", r.text


MUTATIONS = CASES // 10  # 20 in CI (100 took 42 s on this loaded machine)


@pytest.fixture(scope="module")
def tools_http(deploy_app):
    """tests/serve/test_tools.py's graph (2,048 tokens of context, greedy): there a mutated
    request that fits gets a few tokens generated, its answer shaped by the protocol."""
    with httpx.Client(base_url=deploy_app("tools", TOOLS_ARGS), timeout=60) as client:
        yield client


def test_mutated_agent_requests(http, tools_http):
    """Seeded mutations of the agents' requests (tests/serve/mutations.py), alternately on the
    fuzz graph (64 KiB, 16 tokens a slot: refused before generation) and on the tools graph
    (cut down to the last message, so generated): no 5xx, and the envelope on every refusal."""
    for i in range(MUTATIONS):
        path, body = SEEDS[i % len(SEEDS)]
        client = tools_http if i % 2 else http
        content = encode(mutate(random.Random(i), path, body, small=client is tools_http))
        r = client.post(path, content=content, headers={"content-type": "application/json"})
        check_answer("mutated agent requests", r.status_code, r.content)
    assert tools_http.get("/health").status_code == 200


# the minimal inputs of the 5xx the mutations found (issue #27), each with its answer
MUTATION_FINDINGS = [
    # an integer past 64 bits in a tool's schema made llguidance raise ValueError (500); it is
    # a float now, as nlohmann::json parses it: refused where it is a bound, kept elsewhere
    ({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1, "tools": [
        {"name": "t", "input_schema": {"type": "object", "properties": {
            "a": {"type": "array", "maxItems": 2**64}}}}]}, 400),
    ({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1, "tools": [
        {"name": "t", "input_schema": {"type": "object", "properties": {
            "a": {"type": "integer", "minimum": 10**30}}}}]}, 400),
    ({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1, "tools": [
        {"name": "t", "input_schema": {"type": "object", "x-size": 2**70, "properties": {
            "a": {"type": "string"}}}}]}, 200),
]


@pytest.mark.parametrize(("body", "status"), MUTATION_FINDINGS)
def test_mutation_findings(tools_http, body, status):
    r = tools_http.post("/v1/messages", content=encode(body))
    assert r.status_code == status, r.text
    if status != 200:
        assert "JSON schema conversion failed" in assert_envelope(status, r.content)["message"]


def test_reference_500s_are_400_here(http):
    """Where llama-server answers 500 (a body that is not JSON, a wrong-typed ``content`` on
    /tokenize or ``tokens`` on /detokenize), mlxray answers 400 invalid_request_error."""
    for route, content in [("/completion", b"{not json"), ("/tokenize", b"{not json"),
                           ("/detokenize", b"{not json"), ("/tokenize", b'{"content": 5}'),
                           ("/tokenize", b'{"content": {"a": 1}}'),
                           ("/detokenize", b'{"tokens": "abc"}'),
                           ("/detokenize", b'{"tokens": [1.5]}'),
                           ("/detokenize", b'{"tokens": [[1]]}')]:
        r = http.post(route, content=content)
        assert r.status_code == 400, (route, content, r.text)
        assert assert_envelope(400, r.content)["type"] == "invalid_request_error"


def test_non_finite_numbers(http):
    """NaN and Infinity literals are not JSON (400); 1e400 parses as infinity and is echoed as
    null, as nlohmann::json writes it, instead of failing the answer."""
    r = http.post("/completion", content=b'{"prompt":"x","temperature":NaN}')
    assert r.status_code == 400
    assert "invalid literal: NaN" in assert_envelope(400, r.content)["message"]
    r = http.post("/completion", content=b'{"prompt":"x","n_predict":2,"temperature":1e400}')
    assert r.status_code == 200, r.text
    assert r.json()["generation_settings"]["temperature"] is None


@pytest.mark.parametrize("graph", ["local", "served"])
def test_body_over_the_limit_is_413(http, tools_http, graph):
    """On the fuzz graph (64 KiB) and over a real socket on the tools graph (the default 16 MiB),
    where a chunked body is refused while it streams in."""
    client, limit = (http, BODY_LIMIT) if graph == "local" else (tools_http, DEFAULT_BODY_LIMIT)
    big = encode({"prompt": "x" * limit})
    r = client.post("/completion", content=big)
    assert r.status_code == 413
    assert "too large" in assert_envelope(413, r.content)["message"]

    def chunks():  # no Content-Length
        for _ in range(4):
            yield b" " * (limit // 2)

    r = client.post("/tokenize", content=chunks())
    assert r.status_code == 413
    assert_envelope(413, r.content)


# ---- schemathesis ----------------------------------------------------------------------------
# Its coverage phase (boundary values and every wrong type of every field, a few thousand
# requests) runs with the big figures; CI runs the random fuzzing phase only.
COVERAGE = CASES >= 1000
schema = schemathesis.openapi.from_dict(ingress_app.openapi())
schema.config.generation.update(modes=[GenerationMode.POSITIVE, GenerationMode.NEGATIVE],
                                max_examples=CASES, deterministic=True, database="none")
schema.config.phases.update(phases=["examples", "fuzzing"] + (["coverage"] if COVERAGE else []))


# /completions and /chat/completions are the same handlers as /completion and
# /v1/chat/completions
@schema.include(
    path_regex="^/(completion|tokenize|detokenize|v1/completions|v1/chat/completions)$",
).parametrize()
@settings(deadline=None, suppress_health_check=list(HealthCheck))
def test_openapi_schema_fuzz(case, http):
    request = case.as_transport_kwargs(base_url=str(http.base_url))  # requests' keywords
    content = request.get("data")
    if "json" in request:  # as requests encodes it (NaN allowed), not as httpx would
        content = json.dumps(request["json"]).encode()
    response = http.request(request["method"], request["url"], params=request.get("params"),
                            headers=request.get("headers"), content=content)
    check_answer("schemathesis", response.status_code, response.content)


def test_server_healthy_and_idle_after_the_fuzz(http, fuzz_graph):
    assert http.get("/health").status_code == 200
    r = http.post("/completion", json={"prompt": "def main():\n", "n_predict": 4})
    assert r.status_code == 200
    state = engine_state(fuzz_graph[1])
    assert state["alive"] and is_idle(state)
