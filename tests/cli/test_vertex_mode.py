"""AIP_MODE=PREDICTION on the command line: the routes in the config and AIP_HTTP_PORT over
--port, as llama-server reads them at start."""

from deployments.cli.command import parse, serve_config


def config(argv, environ):
    return serve_config(parse(["-m", "models/tiny-python", *argv], environ))


def test_prediction_mode_sets_routes_and_port():
    got = config(["--port", "9000"], {"AIP_MODE": "PREDICTION", "AIP_HEALTH_ROUTE": "hz"})
    args = got["applications"][0]["args"]
    assert got["http_options"]["port"] == 8080
    assert (args["predict_route"], args["health_route"]) == ("/predict", "/hz")
    got = config([], {"AIP_MODE": "PREDICTION", "AIP_HTTP_PORT": "8181",
                      "AIP_PREDICT_ROUTE": "/v1/p"})
    assert got["http_options"]["port"] == 8181
    assert got["applications"][0]["args"]["predict_route"] == "/v1/p"


def test_without_prediction_mode_nothing_changes():
    got = config(["--port", "9000"], {"AIP_PREDICT_ROUTE": "/p", "AIP_HTTP_PORT": "1"})
    assert got["http_options"]["port"] == 9000
    assert "predict_route" not in got["applications"][0]["args"]
