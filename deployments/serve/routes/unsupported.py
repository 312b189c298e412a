"""Routes of llama-server b10621 that mlxray does not serve: each answers a 501
not_supported_error naming what is missing (and, for work not built yet, the issue that builds
it), after the same guards as every route (503 while loading, the API key)."""

from __future__ import annotations

from fastapi import Request
from fastapi.responses import Response

from deployments.api.errors import ApiError
from deployments.serve.endpoint import IngressBase

# route -> the reason shown to the client
NOT_SUPPORTED = {
    "/rerank": "reranking is not supported by mlxray (it serves no reranking models)",
    "/reranking": "reranking is not supported by mlxray (it serves no reranking models)",
    "/v1/rerank": "reranking is not supported by mlxray (it serves no reranking models)",
    "/v1/reranking": "reranking is not supported by mlxray (it serves no reranking models)",
    "/audio/transcriptions": "audio input is not supported by mlxray (text-only models)",
    "/v1/audio/transcriptions": "audio input is not supported by mlxray (text-only models)",
}


async def not_supported(ingress: IngressBase, request: Request) -> Response:
    await ingress.guard(request)
    raise ApiError(NOT_SUPPORTED[request.url.path], "not_supported_error")
