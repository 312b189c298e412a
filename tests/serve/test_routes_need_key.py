"""Every route the ingress mounts answers 401 without the API key, read from the app's route
table itself (a route added tomorrow is covered without touching this test); the public ones are
named here, as llama-server leaves them open (server-http.cpp's public endpoints: the health
checks and the web page's files)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from deployments.serve.ingress import app

from ..local_graph import local_graph

PUBLIC = {
    ("GET", "/health"), ("GET", "/v1/health"),  # the reference's public endpoints
    ("GET", "/"), ("GET", "/index.html"), ("GET", "/webui/{name}"),  # its frontend paths
    ("GET", "/{path:path}"),  # --path's static files, the web page's own (404 when absent)
    ("GET", "/openapi.json"),  # FastAPI's schema of the routes (no data; issue #28 notes it)
}
KEY = "sk-route-table"


def mounted(router: Any) -> Iterator[tuple[str, str]]:
    """(method, path) of each route of ``router`` and of the routers it includes."""
    for route in router.routes:
        if hasattr(route, "original_router"):
            yield from mounted(route.original_router)
        for method in sorted(getattr(route, "methods", None) or ()):
            if method != "HEAD":
                yield method, route.path


ROUTES = sorted(set(mounted(app.router)))


def concrete(path: str) -> str:
    """A request path for a route's template: each {parameter} filled in."""
    return re.sub(r"\{[^}]+\}", "0", path)


@pytest.fixture(scope="module")
def client() -> Iterator[httpx.Client]:
    with local_graph({"n_parallel": 1, "n_ctx": 128, "api_key": KEY}) as c:
        yield c


def test_the_table_is_read_from_the_app():
    assert len(ROUTES) > 30 and PUBLIC <= set(ROUTES)
    assert ("POST", "/v1/chat/completions") in ROUTES


@pytest.mark.parametrize(("method", "path"), ROUTES, ids=lambda v: v)
def test_every_route_needs_the_key(client, method, path):
    url = concrete(path)
    body = {"json": {}} if method in ("POST", "PUT", "PATCH") else {}
    r = client.request(method, url, **body)
    if (method, path) in PUBLIC:
        assert r.status_code != 401, (method, url)
        return
    assert r.status_code == 401, (method, url, r.status_code, r.text[:200])
    assert r.json()["error"]["type"] == "authentication_error"
    wrong = client.request(method, url, headers={"Authorization": "Bearer sk-wrong"}, **body)
    assert wrong.status_code == 401, (method, url)
    right = client.request(method, url, headers={"Authorization": f"Bearer {KEY}"}, **body)
    assert right.status_code != 401, (method, url)
