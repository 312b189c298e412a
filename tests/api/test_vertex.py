"""Vertex AI's prediction protocol as data (deployments/api/vertex.py), against the reference's
server-http.cpp: aliases, instance checks and the AIP_* variables."""

import pytest

from deployments.api import vertex
from deployments.api.errors import ApiError


@pytest.mark.parametrize(("path", "alias"), [
    ("/v1/chat/completions", "chatCompletions"), ("/apply-template", "applyTemplate"),
    ("/completion", "completion"), ("/v1/completions", "completions"), ("/health", "health"),
    ("/slots/{id_slot}", "slots"), ("/lora-adapters", "loraAdapters"),
    ("/v1/messages/count_tokens", "messagesCountTokens"), ("/v1", "v1")])
def test_request_format_is_the_references_alias(path, alias):
    assert vertex.request_format(path) == alias


def test_first_path_keeps_an_alias():
    table = vertex.alias_table(["/completions", "/v1/completions", "/chat/completions",
                                "/v1/chat/completions"])
    assert table == {"completions": "/completions", "chatCompletions": "/chat/completions"}


@pytest.mark.parametrize(("body", "message"), [
    ([], "request body must be a JSON object"),
    ({}, "request body must include an array field named instances"),
    ({"instances": {}}, "request body must include an array field named instances"),
    ({"instances": [{}] * 129}, "instances array exceeds maximum size of 128")])
def test_bodies_without_instances_are_refused(body, message):
    with pytest.raises(ApiError) as err:
        vertex.instances_of(body)
    assert err.value.code == 400 and err.value.message == message


def test_instances_name_their_route():
    aliases, paths = {"chatCompletions": "/v1/chat/completions"}, ["/v1/chat/completions",
                                                                     "/tokenize"]
    assert vertex.dispatch_of({"@requestFormat": "chatCompletions", "stream": True, "a": 1},
                              aliases, paths) == ("/v1/chat/completions", {"stream": False, "a": 1})
    assert vertex.dispatch_of({"@requestFormat": "/tokenize"}, aliases, paths) == ("/tokenize", {})
    for instance, message in ((3, "each instance must be a JSON object"),
                              ({"@requestFormat": 1}, "each instance must include a string "
                                                      "@requestFormat"),
                              ({"@requestFormat": "nope"}, "no handler registered for "
                                                           "@requestFormat: nope")):
        with pytest.raises(ApiError) as err:
            vertex.dispatch_of(instance, aliases, paths)
        assert err.value.message == message


def test_variables_as_the_reference_reads_them():
    assert vertex.routes_from_env({}) == {} and vertex.port_from_env({}) is None
    assert vertex.routes_from_env({"AIP_MODE": "prediction"}) == {}
    on = {"AIP_MODE": "PREDICTION"}
    assert vertex.routes_from_env(on) == {"predict_route": "/predict", "health_route": None}
    assert vertex.port_from_env(on) == 8080
    given = {**on, "AIP_PREDICT_ROUTE": "v1/endpoints/x:predict", "AIP_HEALTH_ROUTE": "/hz",
             "AIP_HTTP_PORT": "8181"}
    assert vertex.routes_from_env(given) == {"predict_route": "/v1/endpoints/x:predict",
                                             "health_route": "/hz"}
    assert vertex.port_from_env(given) == 8181
    with pytest.raises(ValueError, match="AIP_HTTP_PORT"):
        vertex.port_from_env({**on, "AIP_HTTP_PORT": "http"})
