"""Several models in one application (``args.models``, configs/multi-model.yaml): one replica
deployment per model, each with its own engine settings, picked by the request's ``model`` as
/v1/models lists them; the first model answers requests that name none.

One deployment of two entries of the embedded weights under different names and settings; what
each route answers shows which model's replica and settings served it."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml

from deployments.api.config import GraphArgs

from ..conftest import MODEL
from ..reliability import dedicated_app

APP = "models2"
TWO_MODELS = {
    "n_batch": 64, "metrics": True,
    "models": [
        {"alias": "tiny-a", "n_parallel": 2, "n_ctx": 256},
        {"alias": "tiny-b", "n_parallel": 1, "n_ctx": 1024, "embeddings": True,
         "pooling": "mean"},
    ],
}
GREEDY = {"prompt": "def main():\n", "n_predict": 3, "temperature": 0, "cache_prompt": False}
MULTI_YAML = Path(__file__).resolve().parents[2] / "configs" / "multi-model.yaml"


@pytest.fixture(scope="module")
def two(serve_instance: int) -> Iterator[httpx.Client]:
    replicas = {"ray_actor_options": {"num_cpus": 0.25}}
    with dedicated_app(serve_instance, APP, TWO_MODELS, replicas) as base:
        with httpx.Client(base_url=base, timeout=120) as client:
            yield client


def not_found(name: str) -> dict:
    return {"error": {"code": 400, "message": f"model '{name}' not found",
                      "type": "invalid_request_error"}}


def predicted_total(client: httpx.Client, model: str) -> float:
    text = client.get("/metrics", params={"model": model}).text
    line = next(x for x in text.splitlines() if x.startswith("llamacpp:tokens_predicted_total"))
    return float(line.split()[-1])


# ---- the configuration -----------------------------------------------------------------------
def test_entries_take_the_shared_keys_and_their_own():
    a, b = GraphArgs.model_validate({"model": MODEL, **TWO_MODELS}).model_configs()
    assert (a.model_name, a.n_parallel, a.n_ctx, a.n_batch, a.embeddings) == (
        "tiny-a", 2, 256, 64, False)
    assert (b.model_name, b.n_parallel, b.n_ctx, b.n_batch, b.embeddings) == (
        "tiny-b", 1, 1024, 64, True)
    assert a.metrics and b.metrics
    one = GraphArgs.model_validate({"model": MODEL})
    assert one.model_configs() == (one,)


@pytest.mark.parametrize("models,message", [
    ([{"alias": "x"}, {"alias": "x"}], "model 'x' appears multiple times"),
    ([{}, {}], "appears multiple times"),  # the same folder, no aliases: the same name
    ([{"alias": "x", "api_key": "k"}], "models[0]: api_key is set for the whole application"),
    ([{"alias": "x"}, {"alias": "y", "n_parallel": 0}], "models[1]: n_parallel: Input should"),
    ([{"alias": "x", "n_slots": 2}], "models[0]: n_slots: Extra inputs are not permitted"),
])
def test_bad_entries_fail_at_start_naming_themselves(models, message):
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
        GraphArgs.model_validate({"model": MODEL, "models": models})


def test_multi_model_yaml_is_a_valid_serve_config():
    """Its ``deployments`` section names the per-model deployments the graph builds."""
    from ray.serve._private.api import call_user_app_builder_with_args_if_necessary
    from ray.serve.schema import ServeDeploySchema

    from deployments.serve.graph import build_app, deployment_suffix

    config = yaml.safe_load(MULTI_YAML.read_text())
    ServeDeploySchema.model_validate(config)
    app = config["applications"][0]
    names = [m.model_name for m in GraphArgs.model_validate(app["args"]).model_configs()]
    assert len(names) == 2
    built = {f"{kind}{deployment_suffix(n)}" for n in names
             for kind in ("ModelReplica", "ResponseShaper")} | {"Ingress"}
    assert {d["name"] for d in app["deployments"]} == built
    call_user_app_builder_with_args_if_necessary(build_app, app["args"])


def test_names_that_would_share_deployments_fail_at_build():
    from deployments.serve.graph import build_app

    with pytest.raises(ValueError, match=r"would share the deployment names \*:a_b"):
        build_app({"model": MODEL, "models": [{"alias": "a.b"}, {"alias": "a_b"}]})


# ---- one application of two models ------------------------------------------------------------
def test_one_replica_deployment_per_model(two):
    from ray import serve

    deployments = serve.status().applications[APP].deployments
    assert set(deployments) == {"Ingress", "ResponseShaper:tiny-a", "ModelReplica:tiny-a",
                                "ResponseShaper:tiny-b", "ModelReplica:tiny-b", "StatusBoard"}
    status = two.get("/mlxray/status").json()["models"]
    assert [(m["name"], m["deployment"], m["n_parallel"]) for m in status] == [
        ("tiny-a", "ModelReplica:tiny-a", 2), ("tiny-b", "ModelReplica:tiny-b", 1)]


def test_models_lists_every_model_in_order(two):
    body = two.get("/v1/models").json()
    assert two.get("/models").json()["models"] == body["models"]
    assert [m["name"] for m in body["models"]] == ["tiny-a", "tiny-b"]
    assert [(m["id"], m["aliases"], m["meta"]["n_ctx"]) for m in body["data"]] == [
        ("tiny-a", ["tiny-a"], 256), ("tiny-b", ["tiny-b"], 1024)]


def test_props_and_slots_answer_for_the_model_named(two):
    for query, name, slots, n_ctx in ((None, "tiny-a", 2, 256), ("tiny-a", "tiny-a", 2, 256),
                                      ("tiny-b", "tiny-b", 1, 1024)):
        params = {"model": query} if query else None
        props = two.get("/props", params=params).json()
        assert (props["model_alias"], props["total_slots"]) == (name, slots)
        assert props["default_generation_settings"]["n_ctx"] == n_ctx
        states = two.get("/slots", params=params).json()  # the replica's own engine
        assert [s["n_ctx"] for s in states] == [n_ctx] * slots


def test_completion_runs_on_the_model_named(two):
    """The replica's own counters: the tokens land on the model the request named only."""
    before = {m: predicted_total(two, m) for m in ("tiny-a", "tiny-b")}
    named = two.post("/completion", json={**GREEDY, "model": "tiny-b"}).json()
    default = two.post("/completion", json=GREEDY).json()
    assert (named["model"], default["model"]) == ("tiny-b", "tiny-a")
    assert named["content"] == default["content"]  # the same weights
    after = {m: predicted_total(two, m) for m in ("tiny-a", "tiny-b")}
    assert after["tiny-a"] - before["tiny-a"] == after["tiny-b"] - before["tiny-b"] == 3


def test_each_model_keeps_its_own_context_size(two):
    prompt = "x = 1\n" * 80  # 321 tokens: over tiny-a's 256, within tiny-b's 1024
    short = two.post("/completion", json={**GREEDY, "prompt": prompt})
    assert short.status_code == 400
    assert "available context size (256 tokens)" in short.json()["error"]["message"]
    long = two.post("/completion", json={**GREEDY, "prompt": prompt, "model": "tiny-b",
                                         "n_predict": 1})
    assert long.status_code == 200 and long.json()["tokens_evaluated"] > 256


def test_openai_routes_answer_as_the_model_named(two):
    chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "model": "tiny-b"}
    assert two.post("/v1/chat/completions", json=chat).json()["model"] == "tiny-b"
    with two.stream("POST", "/v1/completions", json={
            "prompt": "import os\n", "max_tokens": 2, "model": "tiny-b", "stream": True}) as r:
        frames = [json.loads(line[6:]) for line in r.iter_lines()
                  if line.startswith("data: {")]
    assert frames and {f["model"] for f in frames} == {"tiny-b"}
    assert two.post("/tokenize", json={"content": "x", "model": "tiny-b"}).status_code == 200


def test_per_model_switches(two):
    """Embeddings are on for tiny-b only; the default model refuses them as llama-server does."""
    off = two.post("/embedding", json={"content": "def f():"})
    assert off.status_code == 501
    on = two.post("/embedding", json={"content": "def f():", "model": "tiny-b"})
    assert on.status_code == 200 and len(on.json()[0]["embedding"][0]) == 128


@pytest.mark.parametrize("method,path,kwargs", [
    ("POST", "/completion", {"json": {**GREEDY, "model": "nope"}}),
    ("POST", "/v1/chat/completions", {"json": {"model": "nope", "messages": []}}),
    ("POST", "/tokenize", {"json": {"content": "x", "model": "nope"}}),
    ("GET", "/props", {"params": {"model": "nope"}}),
    ("GET", "/metrics", {"params": {"model": "nope"}}),
])
def test_an_unknown_model_is_the_routers_400(two, method, path, kwargs):
    r = two.request(method, path, **kwargs)
    assert (r.status_code, r.json()) == (400, not_found("nope"))


def test_the_handle_api_routes_by_model_too(two):
    from ray import serve

    from deployments.api.errors import RequestError

    handle = serve.get_app_handle(APP)
    assert handle.complete.remote({**GREEDY, "model": "tiny-b"}).result()["model"] == "tiny-b"
    with pytest.raises(RequestError) as err:
        handle.complete.remote({**GREEDY, "model": "nope"}).result()
    assert err.value.envelope == not_found("nope")
