"""The compat manifest bound to the running code: its routes to the ingress's FastAPI app, its
fields to the request schema and to what the real route answers (its command-line options:
tests/compat/test_compat_options.py), mlxray's own additions to the code that provides them;
the rendered docs up to date (``compat.check`` failing on each kind of broken entry:
tests/compat/test_compat_check.py)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import httpx
import pytest

from compat import check, render
from compat.manifest import (
    MANIFEST,
    REFERENCE_KINDS,
    canonical_text,
    load_pin,
    load_shard,
)
from deployments.api.schema import FIELDS, SPECULATIVE_KEYS, Field

from .bound import BY_ID, ENTRIES, params, parser_flags, spellings

THIS = "tests/compat/test_compat.py::"
GREEDY = {"prompt": "def main():\n", "n_predict": 4, "temperature": 0, "cache_prompt": False,
          "return_tokens": True}
# a concrete request path for each templated reference path
CONCRETE = {"${api-prefix}/": "/", "${AIP_HEALTH_ROUTE}": "/aip/health",
            "${AIP_PREDICT_ROUTE:-/predict}": "/predict", "/slots/:id_slot": "/slots/0"}


def checked_by(name: str) -> Callable[[dict], bool]:
    return lambda e: e.get("test", "").split("[")[0] == THIS + name


def schema_key(spec: Field) -> str:
    return f"{spec.parent}.{spec.name}" if spec.parent else spec.name


SCHEMA = {schema_key(f): f for f in FIELDS}
PARENTS = {f.parent for f in FIELDS if f.parent}


def mounted_routes() -> set[str]:
    import deployments.serve.ingress  # noqa: F401  (the route table registers itself on the app)
    from deployments.serve.app import api_routes, app

    return {f"{m} {prefix}{route.path}" for prefix, route in api_routes(app.routes)
            for m in route.methods}


def fastapi_path(path: str) -> str:
    """A reference path in FastAPI's syntax: ``/slots/:id_slot`` -> ``/slots/{id_slot}``."""
    return "/".join(f"{{{p[1:]}}}" if p.startswith(":") else p for p in path.split("/"))


def with_example(entry: dict, body: dict) -> dict:
    facts = entry["facts"]
    assert "example" in facts, f"{entry['id']} needs facts.example (a non-default value)"
    if facts.get("parent"):
        return {**body, facts["parent"]: {facts["name"]: facts["example"]}}
    return {**body, facts["name"]: facts["example"]}


# ---- the manifest itself -----------------------------------------------------------------
def test_manifest_is_valid():
    assert check.check() == []
    reference = [e for e in ENTRIES if e["kind"] in REFERENCE_KINDS]
    # options: 107, then --spec-type and its two ngram-simple sizes (#31), --sleep-idle-seconds,
    # ..., --tags and the four --cors-* (the snapshot's options llama.cpp's tests pass)
    assert len(reference) == sum(load_pin()["counts"].values()) == 53 + 74 + 119


def test_shards_are_canonical():
    for path in sorted(MANIFEST.glob("*.json")):
        if path.name != "pin.json":
            assert path.read_text() == canonical_text(load_shard(path)), path.name


def test_docs_and_readme_are_rendered():
    assert render.outdated() == [], "run python -m compat.render"


# ---- routes: the ingress's FastAPI app ---------------------------------------------------
@pytest.mark.parametrize("entry", params(lambda e: e["kind"] == "route" and "claim" in e))
def test_claimed_route_is_mounted(entry):
    assert entry["claim"] in mounted_routes()


@pytest.mark.parametrize("entry", params(lambda e: e["kind"] == "route" and "claim" not in e
                                         and e["state"] != "deferred"))
def test_unclaimed_route_is_not_mounted(entry):
    assert route_key(entry) not in mounted_routes()


def route_key(entry: dict) -> str:
    """A route entry's ``METHOD /path`` as FastAPI mounts it."""
    facts = entry["facts"]
    return f"{facts['method']} {fastapi_path(CONCRETE.get(facts['path'], facts['path']))}"


def test_every_mounted_route_is_claimed():
    """Each mounted route is a served one's claim, an addition's, or a deferred route answering
    501 until its issue lands."""
    claims = {e.get("claim") for e in ENTRIES if e["kind"] == "route"}
    claims |= {e.get("claim") for e in ENTRIES if e["kind"] == "addition"
               and e["facts"]["surface"] == "route"}
    claims |= {route_key(e) for e in ENTRIES if e["kind"] == "route" and e["state"] == "deferred"}
    assert mounted_routes() - claims == set()


@pytest.mark.parametrize("entry", params(lambda e: e["kind"] == "route" and
                                         e["state"] == "deferred"))
def test_deferred_route_names_its_issue(client, entry):
    """Work not built yet is refused saying so: a mounted route answers 501 naming the issue
    that builds it, an unmounted one the 404 of an unknown route."""
    facts = entry["facts"]
    r = client.request(facts["method"], CONCRETE.get(facts["path"], facts["path"]),
                       content=b"{}" if facts["method"] == "POST" else None)
    if route_key(entry) not in mounted_routes():
        assert (r.status_code, r.json()) == (404, {"error": {
            "code": 404, "message": "File Not Found", "type": "not_found_error"}})
        return
    assert r.status_code == 501
    error = r.json()["error"]
    assert error["type"] == "not_supported_error"
    assert f"not supported by mlxray yet (issue #{entry['issue']})" in error["message"]


@pytest.mark.parametrize("entry", params(checked_by("test_unserved_route_answers_404")))
def test_unserved_route_answers_404(client, entry):
    facts = entry["facts"]
    r = client.request(facts["method"], CONCRETE.get(facts["path"], facts["path"]),
                       content=b"{}" if facts["method"] == "POST" else None)
    assert r.status_code == 404
    assert r.json() == {"error": {"code": 404, "message": "File Not Found",
                                  "type": "not_found_error"}}


def cites(capture: str) -> Callable[[dict], bool]:
    return lambda e: any(capture in d for d in e.get("divergence", []))


@pytest.mark.parametrize("entry", params(cites("err_bad_json")))
def test_body_not_json_is_400_on_every_post_route(client, entry):
    """Every route whose divergence cites the err_bad_json capture answers it so."""
    method, path = entry["claim"].split(" ", 1)
    r = client.request(method, path, content=b"{not json")
    assert r.status_code == 400
    assert r.json()["error"]["type"] == "invalid_request_error"
    assert "parse error" in r.json()["error"]["message"]


# served POST routes that do not parse their body as JSON (or that need a switch the conformance
# graph leaves off, and answer 501 first)
NO_JSON_BODY = {"POST /slots/{id_slot}", "POST /props", "POST /embedding", "POST /embeddings",
                "POST /v1/embeddings", "POST /models/load", "POST /models/unload"}  # router mode
# where the reference catches its parser's error itself: a 400 there too, no divergence
OWN_PARSE_ERROR = {"POST /v1/streams/lookup",  # tests/serve/test_resume.py
                   "POST /{path:path}"}  # Vertex AI's predict: tests/serve/test_vertex.py


def test_every_route_reading_json_cites_err_bad_json():
    """The other way: each served POST route that parses a JSON body lists the divergence."""
    citing = {e["claim"] for e in ENTRIES if cites("err_bad_json")(e)}
    served = {e["claim"] for e in ENTRIES if e["kind"] == "route" and e["state"] == "supported"
              and e["claim"].startswith("POST ")}
    served -= NO_JSON_BODY | OWN_PARSE_ERROR
    assert served - citing == set()


# ---- fields: the request schema and the real route -----------------------------------------
@pytest.mark.parametrize("entry", params(
    lambda e: e["kind"] == "field" and e["state"] in ("supported", "aliased")))
def test_supported_field_is_a_schema_field(entry):
    claim = entry["claim"]
    if claim in SPECULATIVE_KEYS:  # ignored as unknown keys, as the reference ignores them
        assert claim not in SCHEMA
        return
    assert claim in SCHEMA or claim in PARENTS
    if claim in SCHEMA:
        assert SCHEMA[claim].policy != "refused"
        assert list(SCHEMA[claim].aliases) == entry["facts"].get("aliases", [])


def test_every_schema_field_has_an_entry():
    """A reference field's entry, or an addition's (a field of mlxray's own)."""
    assert sorted(k for k in SCHEMA if f"field:{k}" not in BY_ID
                  and f"addition:field:{k}" not in BY_ID) == []


@pytest.mark.parametrize("spec", FIELDS, ids=schema_key)
def test_schema_policy_matches_the_state(spec):
    entry = BY_ID[f"field:{schema_key(spec)}"]
    if spec.policy == "refused":
        assert entry["state"] in ("deferred", "not_applicable")
        assert entry["state"] != "deferred" or entry["issue"] == spec.issue
    else:
        assert entry["state"] in ("supported", "aliased", "by_design")
    if spec.policy == "inert" and entry["state"] == "supported":
        assert entry.get("notes"), "an inert field needs a note on why the reference is inert too"


@pytest.mark.parametrize("entry", params(
    lambda e: e["kind"] == "field" and e["state"] in ("deferred", "not_applicable")))
def test_refused_field_names_itself(client, entry):
    """No field is accepted and ignored: what is not done yet is a 400 naming it (and its issue);
    what has no meaning here is a 400 with the manifest's diagnostic (its claim)."""
    r = client.post("/completion", json=with_example(entry, GREEDY))
    assert r.status_code == 400
    error = r.json()["error"]
    assert error["type"] == "invalid_request_error"
    name = entry["facts"]["name"]
    if entry["state"] == "deferred":
        assert error["message"] == (f"Field '{name}': not supported by mlxray yet "
                                    f"(issue #{entry['issue']})")
    else:
        assert error["message"] == entry["claim"]


@pytest.fixture(scope="module")
def greedy_answer(base_url: str) -> dict:
    r = httpx.post(base_url + "/completion", json=GREEDY, timeout=120)
    assert r.status_code == 200
    return r.json()


@pytest.mark.parametrize("entry", params(checked_by("test_inert_field_changes_nothing")))
def test_inert_field_changes_nothing(client, greedy_answer, entry):
    claim = entry["claim"]
    assert claim in SPECULATIVE_KEYS or SCHEMA[claim].policy == "inert"
    r = client.post("/completion", json=with_example(entry, GREEDY))
    assert r.status_code == 200, r.text
    assert r.json()["content"] == greedy_answer["content"]
    assert r.json()["tokens"] == greedy_answer["tokens"]


class _SilentModel:
    """The model's SSE items as the route sees them: a first frame, then ``delay`` s of
    silence."""

    def __init__(self, delay: float):
        self.delay = delay

    def sse(self, params, prompts, oai=None):
        return _Frames(self.delay)


class _Frames:
    """A Ray Serve response generator's surface: async iteration and cancel."""

    def __init__(self, delay: float):
        self.sent, self.delay = 0, delay

    def __aiter__(self):
        return self

    async def __anext__(self) -> bytes:
        self.sent += 1
        if self.sent == 1:
            return b"data: first\n\n"
        if self.sent == 2:
            await asyncio.sleep(self.delay)
            return b"data: late\n\n"
        raise StopAsyncIteration

    def cancel(self) -> None:
        pass


def test_sse_ping_after_silence():
    """sse_ping_interval as the native route reads it: the request's value, parsed by the schema,
    makes the route's SSE body send a ``:`` comment after that many seconds without a frame; the
    default (30 s) and -1 send none within 1.3 s."""
    from deployments.api.schema import CompletionParams, ParseContext, parse_completion
    from deployments.serve.routes.native import stream

    async def body(fields: dict) -> list[bytes]:
        params = parse_completion({"stream": True, **fields}, ParseContext(), CompletionParams())
        response = await stream(_SilentModel(1.3), params, [[0]])
        return [chunk async for chunk in response.body_iterator]

    frames = [b"data: first\n\n", b"data: late\n\n"]
    assert asyncio.run(body({"sse_ping_interval": 1})) == [frames[0], b":\n\n", frames[1]]
    assert asyncio.run(body({})) == frames
    assert asyncio.run(body({"sse_ping_interval": -1})) == frames


# ---- additions: mlxray's own, bound to the code that provides them ----------------------------
@pytest.mark.parametrize("entry", params(lambda e: e["kind"] == "addition" and
                                         e["state"] == "supported"))
def test_addition_is_bound_to_the_code(entry):
    """A route is mounted, an option is the parser's (and no reference option's), a config key
    is a GraphArgs field, a handle method is the ingress's, a field is the schema's (and no
    reference field's), a behaviour names the code (``module:attribute``) that provides it."""
    import importlib

    from deployments.api.config import GraphArgs
    from deployments.serve.ingress import Ingress

    surface, claim = entry["facts"]["surface"], entry["claim"]
    if surface == "route":
        assert claim in mounted_routes()
    elif surface == "option":
        reference = {f for e in ENTRIES if e["kind"] == "option" for f in spellings(e)}
        assert claim in parser_flags() and claim not in reference
    elif surface == "config":
        assert claim in GraphArgs.model_fields
    elif surface == "handle":
        assert callable(getattr(Ingress.func_or_class, claim, None))
    elif surface == "field":
        assert claim in SCHEMA and f"field:{claim}" not in BY_ID
    else:
        module, _, attribute = claim.partition(":")
        assert getattr(importlib.import_module(module), attribute, None) is not None


def test_known_differences_are_listed_divergences():
    """The conformance replay's known differences: the route each one hits lists it as a
    divergence, naming the capture."""
    from ..serve.test_conformance import CAPTURE_LIST, KNOWN_DIFFERENCES

    for capture in CAPTURE_LIST:
        probe = capture["probe"]
        if probe["name"] in KNOWN_DIFFERENCES:
            entry = BY_ID[f"route:{probe.get('method', 'POST')} {probe['path']}"]
            assert cites(probe["name"])(entry), probe["name"]
