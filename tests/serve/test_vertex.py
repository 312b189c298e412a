"""Vertex AI's routes on the conformance graph (AIP_MODE=PREDICTION AIP_HEALTH_ROUTE=/aip/health:
tests/conftest.py), each answer checked against the route's own, as the reference's
tests/unit/test_compat_gcp.py does and beyond."""

import pytest

from deployments.serve.app import app
from deployments.serve.routes.vertex import check_routes

CHAT = {"max_tokens": 8, "temperature": 0,
        "messages": [{"role": "user", "content": "What is the meaning of life?"}]}


def predict(client, *instances, **body):
    r = client.post("/predict", json={"instances": list(instances), **body})
    assert r.status_code == 200, r.text
    return r.json()["predictions"]


def test_chat_by_alias_is_the_routes_own_answer(client):
    [got] = predict(client, {"@requestFormat": "chatCompletions", **CHAT})
    direct = client.post("/v1/chat/completions", json=CHAT).json()
    assert got["choices"][0]["message"]["role"] == "assistant"
    assert got["choices"] == direct["choices"]
    assert [got["usage"][k] for k in ("prompt_tokens", "completion_tokens")] == [
        direct["usage"][k] for k in ("prompt_tokens", "completion_tokens")]  # cached_tokens varies
    assert list(got) == list(direct)


def test_instances_answer_in_order_each_its_own(client):
    tokens = client.post("/tokenize", json={"content": "def f():"}).json()
    got = predict(client,
                  {"@requestFormat": "tokenize", "content": "def f():"},
                  {"@requestFormat": "/completion", "prompt": "def", "n_predict": 4,
                   "temperature": 0, "stream": True},
                  {"@requestFormat": "nope"}, 7,
                  {"@requestFormat": "chatCompletions", "messages": 3})
    assert got[0] == tokens
    assert got[1]["tokens_predicted"] == 4 and got[1]["stop"] is True  # stream forced off
    assert got[2] == {"error": {"code": 400, "message": "no handler registered for "
                                "@requestFormat: nope", "type": "invalid_request_error"}}
    assert got[3]["error"]["message"] == "each instance must be a JSON object"
    direct = client.post("/v1/chat/completions", json={"messages": 3})
    assert direct.status_code == 400 and got[4] == direct.json()


@pytest.mark.parametrize(("body", "message"), [
    (b"[1]", "request body must be a JSON object"),
    (b"{}", "request body must include an array field named instances"),
    (b'{"instances": [' + b",".join([b"{}"] * 129) + b"]}",
     "instances array exceeds maximum size of 128")])
def test_bodies_without_instances_are_400(client, body, message):
    r = client.post("/predict", content=body)
    assert r.status_code == 400 and r.json()["error"]["message"] == message


def test_health_route_and_unknown_paths(client):
    r = client.get("/aip/health")
    assert r.status_code == 200 and r.json() == {"status": "ok"}
    for method, path in (("POST", "/predict/more"), ("POST", "/nowhere"), ("GET", "/predict")):
        r = client.request(method, path, content=b"{}")
        assert r.status_code == 404 and r.json()["error"]["message"] == "File Not Found"


def test_a_predict_route_that_is_a_route_is_refused():
    check_routes(app, "/predict")
    with pytest.raises(ValueError, match="AIP_PREDICT_ROUTE=/completion conflicts"):
        check_routes(app, "/completion")


def test_a_body_not_json_is_400(client):
    r = client.post("/predict", content=b"{not json")
    assert r.status_code == 400 and "parse error" in r.json()["error"]["message"]
