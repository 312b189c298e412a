"""The ingress deployment: llama-server's HTTP routes (FastAPI), request validation and the
error envelope. Everything a request can be refused for is checked here, before anything is
queued: the JSON, the schema, the prompt's tokens and its length. The tokenizer is loaded here
too (no model).

This file is the route table; each handler lives in ``deployments/serve/routes/<area>.py``.
"""

from collections.abc import AsyncIterator
from typing import Any

from fastapi import Request
from fastapi.responses import Response
from ray import serve

from deployments.api import openapi
from deployments.serve import channel
from deployments.serve.app import app
from deployments.serve.endpoint import IngressBase
from deployments.serve.routes import (
    adapters,
    control,
    embeddings,
    infill,
    info,
    native,
    oai,
    protocols,
    resume,
    router_mode,
    unsupported,
    vertex,
    webui,
)


@serve.deployment(name="Ingress", max_ongoing_requests=1000)
@serve.ingress(app)
class Ingress(IngressBase):
    """ingress -> response shaper -> model replica; see deployments/serve/graph.py."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        vertex.check_routes(app, self.args.predict_route)

    @app.post("/completion", openapi_extra=openapi.body(openapi.COMPLETION))
    @app.post("/completions", openapi_extra=openapi.body(openapi.COMPLETION))
    async def completion(self, request: Request) -> Response:
        return await native.completion(self, request)

    @app.post("/v1/completions", openapi_extra=openapi.body(openapi.OAI_COMPLETION))
    async def oai_completions(self, request: Request) -> Response:
        return await oai.completions(self, request)

    @app.post("/chat/completions", openapi_extra=openapi.body(openapi.CHAT))
    @app.post("/v1/chat/completions", openapi_extra=openapi.body(openapi.CHAT))
    async def chat_completions(self, request: Request) -> Response:
        return await oai.chat_completions(self, request)

    @app.post("/chat/completions/input_tokens")
    @app.post("/v1/chat/completions/input_tokens")
    async def chat_input_tokens(self, request: Request) -> Response:
        return await oai.chat_input_tokens(self, request)

    @app.post("/responses")
    @app.post("/v1/responses")
    async def responses_api(self, request: Request) -> Response:
        return await protocols.answer(self, request, "responses")

    @app.post("/responses/input_tokens")
    @app.post("/v1/responses/input_tokens")
    async def responses_input_tokens(self, request: Request) -> Response:
        return await protocols.input_tokens(self, request, "responses")

    @app.post("/v1/messages")
    async def messages_api(self, request: Request) -> Response:
        return await protocols.answer(self, request, "messages")

    @app.post("/v1/messages/count_tokens")
    async def messages_count_tokens(self, request: Request) -> Response:
        return await protocols.input_tokens(self, request, "messages")

    @app.post("/apply-template")
    async def apply_template(self, request: Request) -> Response:
        return await oai.apply_template(self, request)

    @app.post("/tokenize", openapi_extra=openapi.body(openapi.TOKENIZE))
    async def tokenize(self, request: Request) -> Response:
        return await native.tokenize(self, request)

    @app.post("/detokenize", openapi_extra=openapi.body(openapi.DETOKENIZE))
    async def detokenize(self, request: Request) -> Response:
        return await native.detokenize(self, request)

    @app.post("/embedding")
    @app.post("/embeddings")
    async def embedding(self, request: Request) -> Response:
        return await embeddings.native(self, request)

    @app.post("/v1/embeddings")
    async def oai_embeddings(self, request: Request) -> Response:
        return await embeddings.oai(self, request)

    @app.get("/health")
    @app.get("/v1/health")
    async def health(self, request: Request) -> Response:
        return await native.health(self, request)

    @app.get("/props")
    async def props(self, request: Request) -> Response:
        return await info.props(self, request)

    @app.post("/props")
    async def set_props(self, request: Request) -> Response:
        return await info.set_props(self, request)

    @app.get("/models")
    @app.get("/v1/models")
    async def models(self, request: Request) -> Response:
        return await info.models(self, request)

    # router mode (--models-dir): 404 without it, as the reference's routes are not mounted
    @app.post("/models/load")
    async def models_load(self, request: Request) -> Response:
        return await router_mode.load(self, request)

    @app.post("/models/unload")
    async def models_unload(self, request: Request) -> Response:
        return await router_mode.unload(self, request)

    @app.get("/models/sse")
    async def models_events(self, request: Request) -> Response:
        return await router_mode.events(self, request)

    @app.get("/slots")
    async def slots(self, request: Request) -> Response:
        return await info.slots(self, request)

    @app.post("/slots/{id_slot}")
    async def slot_action(self, request: Request, id_slot: str) -> Response:
        return await info.slot_action(self, request, id_slot)

    @app.get("/metrics")
    async def metrics(self, request: Request) -> Response:
        return await info.metrics(self, request)

    @app.get("/")
    @app.get("/index.html")
    async def webui_page(self, request: Request) -> Response:
        return await webui.page(self, request)

    @app.get("/webui/{name}")
    async def webui_asset(self, request: Request, name: str) -> Response:
        return await webui.asset(self, request, name)

    @app.get("/mlxray/status")
    async def status(self, request: Request) -> Response:
        return await webui.status(self, request)

    @app.get("/lora-adapters")
    async def lora_adapters(self, request: Request) -> Response:
        return await adapters.list_adapters(self, request)

    @app.post("/lora-adapters")
    async def set_lora_adapters(self, request: Request) -> Response:
        return await adapters.set_scales(self, request)

    # resumable streams (routes/resume.py): a stream sent with X-Conversation-Id outlives its
    # client; these read it again, look it up and stop it
    @app.get("/v1/stream")
    async def stream_resume(self, request: Request) -> Response:
        return await resume.get_stream(self, request)

    @app.delete("/v1/stream")
    async def stream_stop(self, request: Request) -> Response:
        return await resume.stop(self, request)

    @app.post("/v1/streams/lookup")
    async def streams_lookup(self, request: Request) -> Response:
        return await resume.lookup(self, request)

    # a running completion's reasoning ended (routes/control.py)
    @app.post("/v1/chat/completions/control")
    async def completion_control(self, request: Request) -> Response:
        return await control.control(self, request)

    # llama-server routes mlxray does not serve: a 501 envelope each (routes/unsupported.py).
    # Router mode's model downloads (/models POST, DELETE), /tools and /cors-proxy are not
    # mounted: they answer 404 as an unknown route.
    @app.post("/infill")
    async def fill_in_the_middle(self, request: Request) -> Response:
        return await infill.infill(self, request)

    @app.post("/rerank")
    @app.post("/reranking")
    @app.post("/v1/rerank")
    @app.post("/v1/reranking")
    @app.post("/audio/transcriptions")
    @app.post("/v1/audio/transcriptions")
    async def not_supported(self, request: Request) -> Response:
        return await unsupported.not_supported(self, request)

    # last: Vertex AI's health route (AIP_HEALTH_ROUTE: routes/vertex.py), else --path's files
    # at any other GET path; Vertex AI's predict route at any other POST path (AIP_MODE=PREDICTION)
    # (an unknown route answers 404 as before)
    @app.get("/{path:path}")
    async def static_file(self, request: Request, path: str) -> Response:
        if vertex.is_health_route(self, path):  # not public: the reference asks for the key
            self.check_key(request)
            return await native.health(self, request)
        return await webui.static_file(self, request, path)

    @app.post("/{path:path}")
    async def predict(self, request: Request, path: str) -> Response:
        return await vertex.predict_or_unknown(self, request, path)

    # ---- Python callers (a DeploymentHandle, no HTTP): see README "From Python" ---------------
    async def complete(self, body: dict) -> Any:
        return await native.complete_handle(self, body)

    async def stream(self, body: dict) -> AsyncIterator[dict]:
        async for frame in native.stream_handle(self, body):
            yield frame

    async def responses(self, body: dict) -> Any:
        return await protocols.complete_handle(self, body, "responses")

    async def responses_stream(self, body: dict) -> AsyncIterator[dict]:
        async for event in protocols.stream_handle(self, body, "responses"):
            yield event

    async def messages(self, body: dict) -> Any:
        return await protocols.complete_handle(self, body, "messages")

    async def messages_stream(self, body: dict) -> AsyncIterator[dict]:
        async for event in protocols.stream_handle(self, body, "messages"):
            yield event

    async def channel_state(self) -> dict:
        """What this process's stream-channel listener has received
        (deployments/serve/channel.py)."""
        return channel.listener().state()
