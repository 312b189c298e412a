"""The rest of llama-server's surface through the real graph: /props, /models, /slots (state and
save/restore/erase), /metrics, the API key, CORS, and the routes mlxray does not serve."""

from __future__ import annotations

import asyncio
import importlib.metadata
import json
import re
import time
from collections.abc import Iterator

import httpx
import pytest

from deployments.cli import command as cli
from deployments.serve.routes import info, unsupported

from ..conftest import MODEL
from ..reliability import dedicated_app

GREEDY = {"temperature": 0, "cache_prompt": False}
KEY = "sesame"
# the locked graph's llama-server command line (2 slots of 512 tokens)
LOCKED_ARGV = ["-m", MODEL, "-a", "locked", "-np", "2", "-c", "1024", "-b", "512", "--api-key",
               KEY, "--no-slots", "--props", "--embedding", "--pooling", "mean",
               "--reasoning-format", "auto", "--reasoning-budget", "0"]


@pytest.fixture(scope="module")
def locked(serve_instance, tmp_path_factory) -> Iterator[tuple[str, str]]:
    """A second graph, the application the mlxray command builds from LOCKED_ARGV: API key,
    /slots and /metrics off, POST /props, slot files, embeddings (mean pooling), and the
    server-wide reasoning_format and reasoning budget."""
    folder = str(tmp_path_factory.mktemp("slots"))
    config = cli.serve_config(cli.parse([*LOCKED_ARGV, "--slot-save-path", folder], {}))
    with dedicated_app(serve_instance, "locked", config["applications"][0]["args"]) as base:
        yield base, folder


def keyed(base: str, **headers) -> httpx.Client:
    return httpx.Client(base_url=base, timeout=120,
                        headers={"Authorization": f"Bearer {KEY}", **headers})


# ---- props, models -------------------------------------------------------------------------
def capture_answer(name: str) -> dict:
    import json as _json

    from ..conftest import CAPTURES

    return _json.loads((CAPTURES / f"{name}.json").read_text())["answer"]["body"]


def test_props_values(client):
    """Every value of the reference's /props on the same settings (capture props), in its key
    order, but what names this process: the model's path, the random media marker and the build
    it answers as."""
    props = client.get("/props").json()
    reference = capture_answer("props")
    assert list(props) == list(reference)
    own = {"model_path", "media_marker", "build_info"}
    assert {k: v for k, v in props.items() if k not in own} == {
        k: v for k, v in reference.items() if k not in own}
    assert props["model_path"].endswith("models/tiny-python")
    assert props["media_marker"].startswith("<__media_") and len(props["media_marker"]) == 44
    assert props["build_info"] == f"b10621-mlxray-{importlib.metadata.version('mlxray')}"
    assert re.fullmatch(r"b(\d+)-(\S+)", props["build_info"]).group(1) == "10621"


# " return" opens the budget, "\n" ends it; "def main():\n" greedily goes on "    return codecs"
BUDGET_TAGS = {"prompt": "def main():\n", "n_predict": 8, "reasoning_budget_start_tag": " return",
               "reasoning_budget_end_tags": ["\n"], "reasoning_budget_message": " None", **GREEDY}


def test_reasoning_flags_set_the_request_defaults(locked):
    """--reasoning-format and --reasoning-budget are the server defaults of a request's
    reasoning_format (echoed; /props shows a fresh task's "none", as the reference does) and
    reasoning_budget_tokens (a budget of 0 ends the reasoning as soon as it opens)."""
    with keyed(locked[0]) as c:
        default = c.post("/completion", json=BUDGET_TAGS).json()
        unbudgeted = c.post("/completion", json={**BUDGET_TAGS, "reasoning_budget_tokens": -1})
        named = c.post("/completion", json={**BUDGET_TAGS, "reasoning_format": "none"}).json()
        props = c.get("/props").json()["default_generation_settings"]["params"]
    assert default["content"].startswith("    return None\n")
    assert unbudgeted.json()["content"].startswith("    return codecs")
    assert default["generation_settings"]["reasoning_format"] == "auto"
    assert named["generation_settings"]["reasoning_format"] == "none"
    assert props["reasoning_format"] == "none"


def test_post_props_needs_the_switch(client, locked):
    r = client.post("/props", json={})
    assert r.status_code == 501
    assert r.json()["error"]["type"] == "not_supported_error"
    with keyed(locked[0]) as c:
        assert c.post("/props", json={}).json() == {"success": True}


def test_models_both_routes(client):
    """Both routes answer the same body; the model's figures are the reference's (capture models)
    but for the file format ("mlx") and the time of the answer."""
    models = client.get("/models").json()
    v1 = client.get("/v1/models").json()
    for body in (models, v1):
        body["data"][0].pop("created")
    assert models == v1
    reference = capture_answer("models")
    meta, ref_meta = models["data"][0]["meta"], reference["data"][0]["meta"]
    assert models["data"][0]["id"] == reference["data"][0]["id"] == "tiny-python"
    same = ("n_vocab", "n_ctx", "n_ctx_train", "n_embd", "n_params", "size", "ftype")
    assert {k: meta[k] for k in same} == {k: ref_meta[k] for k in same}
    assert models["models"][0]["details"]["format"] == "mlx"


# ---- slots ---------------------------------------------------------------------------------
def test_slots_busy_while_streaming_then_idle(base_url, client):
    async def scenario():
        async with httpx.AsyncClient(base_url=base_url, timeout=120) as ac:
            body = {"prompt": "def main():\n", "n_predict": 400, "ignore_eos": True,
                    "stream": True, **GREEDY}
            async with ac.stream("POST", "/completion", json=body) as r:
                lines = r.aiter_lines()
                async for line in lines:
                    if line.startswith("data: "):
                        break
                busy = (await ac.get("/slots")).json()
                refused = await ac.get("/slots?fail_on_no_slot=1")
                async for _ in lines:
                    pass
        return busy, refused

    busy, refused = asyncio.run(scenario())
    running = [s for s in busy if s["is_processing"]]
    assert len(running) == 1
    slot = running[0]
    assert slot["params"]["n_predict"] == 400 and slot["params"]["stream"] is True
    assert slot["next_token"][0]["has_next_token"] is True
    assert slot["next_token"][0]["n_decoded"] >= 1
    assert refused.status_code == 200  # three slots were still idle
    after = client.get("/slots").json()
    assert not any(s["is_processing"] for s in after)
    done = next(s for s in after if s["id"] == slot["id"])
    assert done["id_task"] == slot["id_task"]
    assert done["next_token"][0] == {"has_next_token": False, "has_new_line": True,
                                     "n_remain": 0, "n_decoded": 400}
    assert list(done) == ["id", "n_ctx", "speculative", "is_processing", "id_task",
                          "n_prompt_tokens", "n_prompt_tokens_processed",
                          "n_prompt_tokens_cache", "params", "next_token"]


def test_slots_switched_off(locked):
    with keyed(locked[0]) as c:
        r = c.get("/slots")
    assert r.status_code == 501
    assert r.json()["error"]["message"] == (
        "This server does not support slots endpoint. Start it with `--slots`")


def test_slot_save_restore_erase(locked, client):
    base, folder = locked
    prompt = "class Foo:\n    def __init__(self"
    with keyed(base) as c:
        first = c.post("/completion", json={"prompt": prompt, "n_predict": 4,
                                            "temperature": 0, "id_slot": 0}).json()
        saved = c.post("/slots/0?action=save", json={"filename": "foo.bin"}).json()
        assert saved["id_slot"] == 0 and saved["filename"] == "foo.bin"
        assert saved["n_saved"] > 0 and saved["n_written"] > 0
        assert list(saved["timings"]) == ["save_ms"]
        erased = c.post("/slots/0?action=erase").json()
        assert erased == {"id_slot": 0, "n_erased": saved["n_saved"]}
        restored = c.post("/slots/1?action=restore", json={"filename": "foo.bin"}).json()
        assert restored["n_restored"] == saved["n_saved"]
        again = c.post("/completion", json={"prompt": prompt, "n_predict": 4,
                                            "temperature": 0, "id_slot": 1}).json()
        assert again["content"] == first["content"]
        assert again["timings"]["cache_n"] == len(c.post(
            "/tokenize", json={"content": prompt, "add_special": True}).json()["tokens"]) - 1
        for name in ("../escape", "/etc/passwd", "a/b", "..", ""):
            r = c.post("/slots/0?action=save", json={"filename": name})
            assert (r.status_code, r.json()["error"]["message"]) == (400, "Invalid filename")
        assert c.post("/slots/0?action=nope").json()["error"]["message"] == "Invalid action"
        assert c.post("/slots/9?action=erase").json()["error"]["message"] == "Invalid slot ID"
        missing = c.post("/slots/0?action=restore", json={"filename": "none.bin"})
        assert missing.status_code == 400
    # the conformance graph has no slot folder
    r = client.post("/slots/0?action=erase")
    assert r.status_code == 501 and r.json()["error"]["type"] == "not_supported_error"


# ---- metrics -------------------------------------------------------------------------------
def scrape(client) -> dict[str, float]:
    r = client.get("/metrics")
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/plain; version=0.0.4")
    assert int(r.headers["process-start-time-unix"]) <= time.time()
    values = {}
    for line in r.text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.split(" ")
            values[name] = float(value)
    return values


def test_metrics_rise_by_the_tokens_used(client):
    before = scrape(client)
    assert set(before) == {f"llamacpp:{n}" for n in info.METRIC_HELP}
    out = client.post("/completion", json={"prompt": "import os\n", "n_predict": 7,
                                           **GREEDY}).json()
    after = scrape(client)
    gained = {k: after[k] - before[k] for k in before}
    assert gained["llamacpp:tokens_predicted_total"] == 7
    assert gained["llamacpp:prompt_tokens_total"] == out["timings"]["prompt_n"]
    assert gained["llamacpp:n_decode_total"] >= 7
    assert gained["llamacpp:prompt_seconds_total"] > 0
    assert after["llamacpp:requests_processing"] == 0


# the reference's exposition (spec section 7): counters, then gauges, each with its help text
REFERENCE_METRICS = [
    ("prompt_tokens_total", "counter", "Number of prompt tokens processed."),
    ("prompt_tokens_cached_total", "counter", "Number of prompt tokens taken from the cache."),
    ("prompt_seconds_total", "counter", "Prompt process time"),
    ("tokens_predicted_total", "counter", "Number of generation tokens processed."),
    ("tokens_predicted_seconds_total", "counter", "Predict process time"),
    ("n_decode_total", "counter", "Total number of llama_decode() calls"),
    ("n_tokens_max", "counter", "Largest observed n_tokens."),
    ("spec_decode_num_draft_tokens_total", "counter", "Number of speculative draft tokens."),
    ("spec_decode_num_accepted_tokens_total", "counter",
     "Number of accepted speculative draft tokens."),
    ("spec_decode_num_drafts_total", "counter", "Number of speculative drafts."),
    ("prompt_tokens_seconds", "gauge", "Average prompt throughput in tokens/s."),
    ("predicted_tokens_seconds", "gauge", "Average generation throughput in tokens/s."),
    ("requests_processing", "gauge", "Number of requests processing."),
    ("requests_deferred", "gauge", "Number of requests deferred."),
    ("n_busy_slots_per_decode", "gauge", "Average number of busy slots per llama_decode() call"),
]


def test_metrics_text_is_the_references(client):
    """Line by line: HELP, TYPE and the sample of each metric, in the reference's order and
    types (n_tokens_max a counter without a _total suffix), values printed as C++ prints a
    double (a whole number without a decimal point)."""
    client.post("/completion", json={"prompt": "import os\n", "n_predict": 3, **GREEDY})
    lines = client.get("/metrics").text.splitlines()
    assert len(lines) == 3 * len(REFERENCE_METRICS)
    for i, (name, kind, help_text) in enumerate(REFERENCE_METRICS):
        full = f"llamacpp:{name}"
        assert lines[3 * i: 3 * i + 2] == [f"# HELP {full} {help_text}", f"# TYPE {full} {kind}"]
        sample, value = lines[3 * i + 2].split(" ")
        assert sample == full and float(value) >= 0
    totals = {line.split(" ")[0]: line.split(" ")[1] for line in lines if line[0] != "#"}
    assert totals["llamacpp:tokens_predicted_total"].isdigit()
    assert totals["llamacpp:spec_decode_num_drafts_total"] == "0"


def test_metrics_switched_off(locked):
    with keyed(locked[0]) as c:
        r = c.get("/metrics")
    assert r.status_code == 501
    assert r.json()["error"]["message"] == (
        "This server does not support metrics endpoint. Start it with `--metrics`")


# ---- API key, CORS, loading ----------------------------------------------------------------
UNAUTHORIZED = {"error": {"message": "Invalid API Key", "type": "authentication_error",
                          "code": 401}}


@pytest.mark.parametrize(("method", "path"), [
    ("POST", "/completion"), ("POST", "/v1/chat/completions"), ("GET", "/props"),
    ("GET", "/v1/models"), ("GET", "/slots"), ("POST", "/tokenize"), ("POST", "/v1/responses"),
])
def test_api_key_required(locked, method, path):
    base = locked[0]
    assert httpx.request(method, base + path, json={}).json() == UNAUTHORIZED
    wrong = httpx.request(method, base + path, json={}, headers={"X-Api-Key": "wrong"})
    assert (wrong.status_code, wrong.json()) == (401, UNAUTHORIZED)


def test_api_key_accepted_and_health_public(locked):
    base = locked[0]
    assert httpx.get(base + "/health").json() == {"status": "ok"}
    assert httpx.get(base + "/v1/health").status_code == 200
    r = httpx.post(base + "/tokenize", json={"content": "x"}, headers={"X-Api-Key": KEY})
    assert r.status_code == 200
    with keyed(base) as c:
        assert c.post("/v1/completions", json={"prompt": "x", "max_tokens": 1}).status_code == 200


def test_cors_and_options(locked, client):
    r = httpx.options(locked[0] + "/v1/chat/completions", headers={"Origin": "http://app"})
    assert r.status_code == 200 and r.content == b""
    assert r.headers["access-control-allow-origin"] == "http://app"
    assert r.headers["access-control-allow-methods"] == "GET, POST, DELETE, OPTIONS"
    assert r.headers["access-control-allow-headers"] == "*"
    assert r.headers["access-control-allow-credentials"] == "true"
    r = client.get("/health", headers={"Origin": "http://app"})
    assert r.headers["access-control-allow-origin"] == "http://app"


PREFLIGHT = {"Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "x"}


def preflight(client: httpx.Client, origin: str) -> httpx.Response:
    return client.options("/completions", headers={"Origin": origin, **PREFLIGHT})


def test_cors_origins_localhost_reflects_only_loopback_origins():
    """llama.cpp's test_cors_origins_localhost_reflects/_rejects, and the other --cors-* flags
    (the graph in-process: the policy is the ingress's, whatever the transport)."""
    from ..local_graph import local_graph

    args = cli.graph_args(cli.parse(["--cors-origins", "localhost", "--cors-methods", "GET",
                                     "--cors-headers", "Authorization",
                                     "--no-cors-credentials"], {}))
    assert (args.cors_origins, args.cors_methods, args.cors_headers, args.cors_credentials) == (
        "localhost", "GET", "Authorization", False)
    settings = {k: getattr(args, k) for k in cli.CORS_DESTS}
    with local_graph({"n_parallel": 1, "n_ctx": 256, **settings}) as client:
        for origin in ("http://localhost", "http://localhost:8080", "http://127.0.0.1",
                       "http://127.0.0.1:3000", "http://[::1]", "http://[::1]:3000"):
            r = preflight(client, origin)
            assert r.status_code == 200 and r.headers["access-control-allow-origin"] == origin
        for origin in ("http://web.mydomain.fr", "http://evil.com", "http://notlocalhost",
                       "http://localhost.evil.com"):
            r = preflight(client, origin)
            assert r.status_code == 200 and "access-control-allow-origin" not in r.headers
            assert "access-control-allow-origin" not in client.get(
                "/health", headers={"Origin": origin}).headers
        r = preflight(client, "http://localhost")
        assert (r.headers["access-control-allow-methods"], r.headers[
            "access-control-allow-headers"], r.headers["access-control-allow-credentials"]) == (
            "GET", "Authorization", "false")
    try:
        with local_graph({"n_parallel": 1, "n_ctx": 256, "cors_origins": "https://app.example"}
                         ) as client:  # any other value is sent as given
            r = client.get("/health", headers={"Origin": "http://evil.com"})
            assert r.headers["access-control-allow-origin"] == "https://app.example"
    finally:  # the policy is the process's (one ingress each under Serve): the default again
        from deployments.api.cors import CorsPolicy
        from deployments.serve.app import CorsMiddleware

        CorsMiddleware.use(CorsPolicy())


# ---- routes mlxray does not serve ----------------------------------------------------------
UNSERVED = [("POST", p) for p in sorted(unsupported.NOT_SUPPORTED)]


@pytest.mark.parametrize(("method", "path"), [pytest.param(m, p, id=p) for m, p in UNSERVED])
def test_unsupported_routes_answer_501(client, method, path):
    r = client.request(method, path, content=json.dumps({}) if method == "POST" else None)
    assert r.status_code == 501
    assert r.json() == {"error": {"code": 501, "message": unsupported.NOT_SUPPORTED[path],
                                  "type": "not_supported_error"}}


@pytest.mark.parametrize("path", ["/embedding", "/embeddings", "/v1/embeddings"])
def test_embeddings_off_by_default(client, path):
    r = client.post(path, json={"input": "x"})
    assert r.status_code == 501
    assert r.json()["error"]["message"] == (
        "This server does not support embeddings. Start it with `--embeddings`")


def test_embeddings_are_pooled_hidden_states(locked):
    import math

    import mlx.core as mx
    from mlx_lm import load

    with keyed(locked[0]) as c:
        tokens = c.post("/tokenize", json={"content": "def main():\n",
                                           "add_special": True}).json()["tokens"]
        raw = c.post("/embedding", json={"content": "def main():\n", "embd_normalize": -1})
        unit = c.post("/embeddings", json={"input": ["def main():\n", "x"]}).json()
        empty = c.post("/embedding", json={"content": [[]]})
    model, _ = load(MODEL)
    expected = mx.mean(model.model(mx.array([tokens]))[0], axis=0).tolist()
    assert [list(x) for x in raw.json()[0].items()][0] == ["index", 0]
    got = raw.json()[0]["embedding"]
    assert len(got) == 1 and len(got[0]) == 128
    assert all(math.isclose(a, b, rel_tol=1e-4, abs_tol=1e-5) for a, b in zip(got[0], expected))
    assert [e["index"] for e in unit] == [0, 1]
    assert math.isclose(math.sqrt(sum(v * v for v in unit[0]["embedding"][0])), 1.0,
                        rel_tol=1e-5)
    assert (empty.status_code, empty.json()["error"]["message"]) == (
        400, "Input content cannot be empty")


def test_openai_embeddings_with_the_sdk(locked):
    import base64
    import struct

    import openai

    sdk = openai.OpenAI(base_url=locked[0] + "/v1", api_key=KEY, max_retries=0)
    out = sdk.embeddings.create(model="locked", input=["def main():\n", "import os\n"])
    assert [d.index for d in out.data] == [0, 1] and len(out.data[0].embedding) == 128
    assert out.usage.prompt_tokens == out.usage.total_tokens > 0
    with keyed(locked[0]) as c:
        packed = c.post("/v1/embeddings", json={"input": "def main():\n",
                                                "encoding_format": "base64"}).json()
    floats = struct.unpack("<128f", base64.b64decode(packed["data"][0]["embedding"]))
    assert all(abs(a - b) < 1e-6 for a, b in zip(floats, out.data[0].embedding))
    assert list(packed) == ["model", "object", "usage", "data"]
