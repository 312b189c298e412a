"""The ingress deployment: llama-server's HTTP routes (FastAPI), request validation and the
error envelope. Everything a request can be refused for is checked here, before anything is
queued: the JSON, the schema, the prompt's tokens and its length. The tokenizer is loaded here
too (no model).

This file is the route table; each handler lives in ``deployments/routes/<area>.py``.
"""

from fastapi import Request
from fastapi.responses import Response
from ray import serve

from .app import app
from .base import IngressBase
from .routes import native


@serve.deployment(name="Ingress", max_ongoing_requests=1000)
@serve.ingress(app)
class Ingress(IngressBase):
    """ingress -> response shaper -> model replica; see deployments/graph.py."""

    @app.post("/completion")
    @app.post("/completions")
    async def completion(self, request: Request) -> Response:
        return await native.completion(self, request)

    @app.post("/tokenize")
    async def tokenize(self, request: Request) -> Response:
        return await native.tokenize(self, request)

    @app.post("/detokenize")
    async def detokenize(self, request: Request) -> Response:
        return await native.detokenize(self, request)

    @app.get("/health")
    @app.get("/v1/health")
    async def health(self, request: Request) -> Response:
        return await native.health(self, request)
