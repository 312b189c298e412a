"""Routes of llama-server b10621 that mlxray does not serve. Each answers what the reference
answers with the feature off (a 501 not_supported_error, or the 403 feature_disabled of /tools and
/cors-proxy), after the same guards as every route (503 while loading, the API key)."""

from __future__ import annotations

from fastapi import Request
from fastapi.responses import Response

from ..app import JSON
from ..base import IngressBase
from ..errors import ApiError
from ..shapes import dumps

# route -> the reason shown to the client
NOT_SUPPORTED = {
    "/responses": "the Responses API is not supported by mlxray",
    "/v1/responses": "the Responses API is not supported by mlxray",
    "/responses/input_tokens": "the Responses API is not supported by mlxray",
    "/v1/responses/input_tokens": "the Responses API is not supported by mlxray",
    "/v1/messages": "the Anthropic Messages API is not supported by mlxray",
    "/v1/messages/count_tokens": "the Anthropic Messages API is not supported by mlxray",
    "/infill": "Infill is not supported by this model: prefix token is missing. "
               "(mlxray does not serve fill-in-the-middle)",
    "/rerank": "This server does not support reranking. Start it with `--reranking`",
    "/reranking": "This server does not support reranking. Start it with `--reranking`",
    "/v1/rerank": "This server does not support reranking. Start it with `--reranking`",
    "/v1/reranking": "This server does not support reranking. Start it with `--reranking`",
    "/lora-adapters": "LoRA adapters are not supported by mlxray",
    "/audio/transcriptions": "audio input is not supported by mlxray (text-only models)",
    "/v1/audio/transcriptions": "audio input is not supported by mlxray (text-only models)",
    "/v1/stream": "resumable streams are not supported by mlxray",
    "/v1/streams/lookup": "resumable streams are not supported by mlxray",
    "/v1/chat/completions/control": "resumable streams are not supported by mlxray",
    "/models/load": "This server is not in router mode: models cannot be loaded or unloaded",
    "/models/unload": "This server is not in router mode: models cannot be loaded or unloaded",
    "/models/sse": "This server is not in router mode: there are no model events",
    "/predict": "the Vertex AI prediction route is not served by mlxray",
}
FEATURE_DISABLED = ("/tools", "/cors-proxy")


async def not_supported(ingress: IngressBase, request: Request) -> Response:
    await ingress.guard(request)
    path = request.url.path
    if path in FEATURE_DISABLED:
        body = {"error": {"message": "this feature is disabled", "type": "feature_disabled"}}
        return Response(dumps(body), status_code=403, media_type=JSON)
    reason = NOT_SUPPORTED.get(path, "This server is not in router mode")
    raise ApiError(reason, "not_supported_error")
