"""Every numeric request field at the edges of its domain, over HTTP (issue 13), on the real model
in the test's own process (tests/local_graph.py: the graph's classes without Ray's hops, which
add nothing here but a few tens of ms to each of the thousand requests).

Hypothesis draws a numeric field of the native schema (or an OpenAI route's own field), a value
from tests/edges.py's EDGES (0, +-1, +-0.5, the int32/uint32/int64 bounds and one past them,
+-1e39, +-1e308, +-1e-30) or any other number, the sampler that reads the field switched on,
greedy or sampled, streamed or not, and sometimes a second such field. The answer must be the
reference's (tests/edge_oracle.py, written from the spec): a 200 whose every number is finite
and whose generation_settings echo the clamped values, the spec's exact 400 text (hard limits,
the sampler-init refusals), or, where the reference's behaviour is undefined, a 400 naming the
field. Never a 5xx; /health 200 and the engine idle afterwards.

Every request bans the model's byte tokens, as the reference captures did, so the reference's
own 500 for output that is not valid UTF-8 cannot hide a failure. The requests that answered 500
before the fix (tests/fixtures/edges_5xx_before.json, from ``python -m tests.edges``) are replayed
first. MLXRAY_EDGE_CASES (default 300) scales the hypothesis examples per route kind.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from deployments.api.schema import FIELDS
from deployments.serve import engines

from ..edge_oracle import SPEC, problems, read
from ..edges import (
    BASE,
    CHAT_BASE,
    EDGES,
    MODES,
    NO_BYTES,
    OAI_CHAT_FIELDS,
    OAI_COMPLETION_FIELDS,
    body_for,
    contexts,
    oai_body,
)
from ..local_graph import engine_state, local_graph_parts
from ..reliability import is_idle

N_PARALLEL = 4
CASES = int(os.environ.get("MLXRAY_EDGE_CASES", "300"))
BEFORE = Path(__file__).resolve().parents[1] / "fixtures" / "edges_5xx_before.json"
STATUSES: Counter = Counter()

EDGE_SETTINGS = settings(max_examples=CASES, deadline=None, derandomize=True, database=None,
                         suppress_health_check=list(HealthCheck))


@pytest.fixture(scope="module")
def edges_graph():
    # a 64-token context: n_predict -1 or 2^31-1 ends within 64 tokens
    with local_graph_parts({"n_parallel": N_PARALLEL, "n_ctx": 64}, engines.mlx_engine) as parts:
        yield parts
        print(f"\nedge requests by status: {dict(STATUSES)}")


@pytest.fixture(scope="module")
def http(edges_graph) -> httpx.Client:
    return edges_graph[0]


def check(http: httpx.Client, route: str, body: dict) -> None:
    r = http.post(route, json=body)
    STATUSES[read(r, bool(body.get("stream")))[0]] += 1
    assert r.status_code < 500, (route, body, r.text[:300])
    differs = problems(route, body, r, N_PARALLEL)
    assert not differs, (route, {k: v for k, v in body.items() if k != "logit_bias"}, differs)


def test_the_oracle_lists_the_schemas_numeric_fields_in_order():
    numeric = [f for f in FIELDS if f.kind in ("int32", "int64", "uint32", "float")]
    assert list(SPEC) == [f.name for f in numeric]
    assert {n: s.aliases for n, s in SPEC.items()} == {f.name: f.aliases for f in numeric}


@pytest.mark.parametrize("case", json.loads(BEFORE.read_text()),
                         ids=lambda c: f"{c['route']}:{json.dumps(c['body'])[-60:]}")
def test_the_requests_that_answered_500_before(http, case):
    # the scan left out what every request of its kind had (tests/edges.py's short)
    base = {**BASE} if case["route"] == "/completion" else {"seed": BASE["seed"]}
    if case["route"] == "/v1/completions":
        base["prompt"] = BASE["prompt"]
    check(http, case["route"], {**base, "logit_bias": NO_BYTES, **case["body"]})


numbers = (st.sampled_from(EDGES) | st.integers(-(2**70), 2**70)
           | st.floats(allow_nan=False, allow_infinity=False))  # JSON has no NaN or Infinity


@st.composite
def native_bodies(draw) -> dict:
    name = draw(st.sampled_from(list(SPEC)))
    key = draw(st.sampled_from((name, *SPEC[name].aliases)))
    body = body_for(key, draw(st.sampled_from(EDGES) | numbers),
                    draw(st.sampled_from(contexts(name))), draw(st.sampled_from(list(MODES))),
                    draw(st.booleans()))
    if draw(st.booleans()):  # a second field at an edge
        body[draw(st.sampled_from(list(SPEC)))] = draw(numbers)
    if draw(st.booleans()):
        body["post_sampling_probs"] = True
    return body


@EDGE_SETTINGS
@given(body=native_bodies())
def test_native_fields_at_their_edges(http, body):
    check(http, "/completion", body)


@st.composite
def oai_bodies(draw) -> tuple[str, dict]:
    route = draw(st.sampled_from(["/v1/completions", "/v1/chat/completions"]))
    names = OAI_COMPLETION_FIELDS if route == "/v1/completions" else OAI_CHAT_FIELDS
    body = oai_body(route, draw(st.sampled_from(names)), draw(numbers),
                    draw(st.sampled_from(list(MODES))), draw(st.booleans()))
    if route == "/v1/chat/completions" and draw(st.booleans()):  # logprobs off, or not a bool
        body.pop("top_logprobs")
        body["logprobs"] = draw(st.sampled_from([False, None]) | numbers)
    return route, body


@settings(EDGE_SETTINGS, max_examples=max(1, CASES // 3))
@given(request=oai_bodies())
def test_openai_fields_at_their_edges(http, request):
    check(http, *request)


def test_chat_base_is_a_valid_request(http):
    r = http.post("/v1/chat/completions", json={**CHAT_BASE, "logit_bias": NO_BYTES})
    assert r.status_code == 200, r.text


def test_server_healthy_and_idle_afterwards(http, edges_graph):
    assert http.get("/health").status_code == 200
    state = engine_state(edges_graph[1])
    assert state["alive"] and is_idle(state), state
