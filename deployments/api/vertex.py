"""Vertex AI's prediction protocol as llama-server serves it (server-http.cpp,
``register_gcp_compat``): with ``AIP_MODE=PREDICTION``, ``POST ${AIP_PREDICT_ROUTE:-/predict}``
takes ``{"instances": [...]}``, each instance a body for the route its ``@requestFormat`` names
(a camelCase alias such as ``chatCompletions`` or the path itself), and answers
``{"predictions": [...]}`` in the same order; ``${AIP_HEALTH_ROUTE}`` is /health's twin.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from deployments.api.errors import ApiError, invalid

MODE_ENV = "AIP_MODE"
HEALTH_ROUTE_ENV = "AIP_HEALTH_ROUTE"
PREDICT_ROUTE_ENV = "AIP_PREDICT_ROUTE"
PORT_ENV = "AIP_HTTP_PORT"
DEFAULT_PREDICT_ROUTE = "/predict"
DEFAULT_PORT = 8080
MAX_INSTANCES = 128
FORMAT_KEY = "@requestFormat"


def request_format(path: str) -> str:
    """A route's camelCase alias, the reference's ``path_to_gcp_format``: ``/v1`` and the
    leading slash dropped, ``/``, ``-`` and ``_`` capitalize the next letter, a path parameter
    (``:id`` there, ``{id}`` here) ends it: ``/v1/chat/completions`` -> ``chatCompletions``."""
    if len(path) > 3 and path.startswith("/v1"):
        path = path[3:]
    path = path.removeprefix("/")
    out, capital = [], False
    for char in path:
        if char in ":{":
            break
        if char in "/-_":
            capital = True
            continue
        out.append(char.upper() if capital else char)
        capital = False
    return "".join(out)


def alias_table(paths: Iterable[str]) -> dict[str, str]:
    """alias -> path over the served routes in their registration order; the first path to
    give an alias keeps it (``completions``: /completions before /v1/completions)."""
    table: dict[str, str] = {}
    for path in paths:
        table.setdefault(request_format(path), path)
    return table


def instances_of(body: Any) -> list:
    """The body's instances, or the reference's 400 for a body that has none to give."""
    if not isinstance(body, dict):
        raise invalid("request body must be a JSON object")
    instances = body.get("instances")
    if not isinstance(instances, list):
        raise invalid("request body must include an array field named instances")
    if len(instances) > MAX_INSTANCES:
        raise invalid(f"instances array exceeds maximum size of {MAX_INSTANCES}")
    return instances


def dispatch_of(instance: Any, aliases: Mapping[str, str],
                paths: Iterable[str]) -> tuple[str, dict]:
    """(the path an instance goes to, its body without ``@requestFormat`` and never streamed);
    an instance that names no route raises the error that becomes its prediction."""
    if not isinstance(instance, dict):
        raise invalid("each instance must be a JSON object")
    fmt = instance.get(FORMAT_KEY)
    if not isinstance(fmt, str):
        raise invalid("each instance must include a string @requestFormat")
    payload = {k: v for k, v in instance.items() if k != FORMAT_KEY}
    if "stream" in payload:
        payload["stream"] = False
    if fmt in aliases:
        return aliases[fmt], payload
    if fmt in set(paths):
        return fmt, payload
    raise invalid(f"no handler registered for @requestFormat: {fmt}")


def server_error(message: str) -> dict:
    return ApiError(message, "server_error").body()


def routes_from_env(environ: Mapping[str, str]) -> dict[str, str | None]:
    """GraphArgs' ``predict_route`` and ``health_route`` as the reference reads its variables:
    nothing without ``AIP_MODE=PREDICTION``; an empty variable is unset; a leading slash
    added where missing."""
    if environ.get(MODE_ENV, "") != "PREDICTION":
        return {}
    return {"predict_route": _route(environ.get(PREDICT_ROUTE_ENV)) or DEFAULT_PREDICT_ROUTE,
            "health_route": _route(environ.get(HEALTH_ROUTE_ENV))}


def port_from_env(environ: Mapping[str, str]) -> int | None:
    """``AIP_HTTP_PORT`` (8080 unset) overrides the port in prediction mode."""
    if environ.get(MODE_ENV, "") != "PREDICTION":
        return None
    raw = environ.get(PORT_ENV) or str(DEFAULT_PORT)
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"{PORT_ENV}={raw!r} is not a port number") from None


def _route(value: str | None) -> str | None:
    if not value:
        return None
    return value if value.startswith("/") else "/" + value
