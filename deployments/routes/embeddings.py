"""The embedding routes: POST /embedding, /embeddings (native) and /v1/embeddings (OpenAI).
Off unless the graph's ``embeddings`` argument is set, as llama-server without ``--embeddings``."""

from __future__ import annotations

from fastapi import Request
from fastapi.responses import Response

from ..base import IngressBase
from ..errors import ApiError

DISABLED = "This server does not support embeddings. Start it with `--embeddings`"


def _check_enabled(ingress: IngressBase) -> None:
    if not ingress.args.embeddings:
        raise ApiError(DISABLED, "not_supported_error")


async def native(ingress: IngressBase, request: Request) -> Response:
    await ingress.guard(request)
    _check_enabled(ingress)
    raise ApiError("embeddings are not implemented by mlxray yet", "not_supported_error")


async def oai(ingress: IngressBase, request: Request) -> Response:
    await ingress.guard(request)
    _check_enabled(ingress)
    raise ApiError("embeddings are not implemented by mlxray yet", "not_supported_error")
