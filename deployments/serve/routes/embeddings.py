"""The embedding routes: POST /embedding, /embeddings (native) and /v1/embeddings (OpenAI).
Off unless the model's ``embeddings`` argument is set, as llama-server without ``--embeddings``;
vectors are the model's last hidden states pooled by the ``pooling`` argument."""

from __future__ import annotations

import base64
import math
import struct

from fastapi import Request
from fastapi.responses import Response

from deployments.api.errors import ApiError, invalid
from deployments.api.json_values import to_int
from deployments.serve.app import from_engine, json_response, off_loop, read_object
from deployments.serve.endpoint import IngressBase, ModelEndpoint
from engine.checks import check_prompt
from engine.types import EngineError

DISABLED = "This server does not support embeddings. Start it with `--embeddings`"


async def _prepare(ingress: IngressBase,
                   request: Request) -> tuple[ModelEndpoint, dict, list[list[int]]]:
    """The model, the body and its prompts' tokens. Off unless the model named serves
    embeddings (when none does, before the body is read)."""
    await ingress.guard(request)
    if not any(m.args.embeddings for m in ingress.models):
        raise ApiError(DISABLED, "not_supported_error")
    body = await read_object(request, ingress.args.max_body_bytes)
    model = await ingress.model_of(body, request)
    if not model.args.embeddings:
        raise ApiError(DISABLED, "not_supported_error")
    prompt = body.get("input", body.get("content"))
    if prompt is None:
        raise invalid('"input" or "content" must be provided')
    items = prompt if isinstance(prompt, list) and not any(
        isinstance(p, int) and not isinstance(p, bool) for p in prompt) else [prompt]
    if not items:
        raise invalid('"input" must not be empty')
    return model, body, await off_loop(_tokens, model, items)


def _tokens(model: ModelEndpoint, items: list) -> list[list[int]]:
    """The inputs' tokens, checked; run off the event loop (a large body takes seconds)."""
    try:
        prompts = [model.vocab.tokenize_prompt(p) for p in items]
        for tokens in prompts:
            if not tokens:
                raise EngineError("Input content cannot be empty")
            check_prompt(tokens, model.vocab.n_vocab, model.args.n_ctx)
    except EngineError as exc:
        raise from_engine(exc) from None
    return prompts


async def _vectors(model: ModelEndpoint, prompts: list[list[int]], norm: int) -> list:
    answer = await model.replica.embed.remote(prompts, model.args.pooling)
    if "error" in answer:
        err = answer["error"]
        raise ApiError(err["message"], err["type"], err["code"])
    if model.args.pooling == "none":
        return answer["result"]
    return [[normalize(v, norm) for v in rows] for rows in answer["result"]]


async def native(ingress: IngressBase, request: Request) -> Response:
    """A JSON array of {index, embedding: [[...]]}: one pooled row, or one row per token."""
    model, body, prompts = await _prepare(ingress, request)
    try:
        norm = to_int(body.get("embd_normalize", 2))
    except ValueError as exc:
        raise invalid(f"Field 'embd_normalize': {exc}") from None
    vectors = await _vectors(model, prompts, norm)
    return json_response([{"index": i, "embedding": v} for i, v in enumerate(vectors)])


async def oai(ingress: IngressBase, request: Request) -> Response:
    """The OpenAI list; a body with ``content`` instead of ``input`` gets the native array."""
    model, body, prompts = await _prepare(ingress, request)
    if "input" not in body:
        return await _native_answer(model, prompts)
    if model.args.pooling == "none":
        raise invalid("Pooling type 'none' is not OAI compatible. Please use a different "
                      "pooling type")
    encoding = body.get("encoding_format", "float")
    if encoding not in ("float", "base64"):
        raise invalid("The format to return the embeddings in. Can be either float or base64")
    vectors = await _vectors(model, prompts, 2)
    data = []
    for i, rows in enumerate(vectors):
        if encoding == "base64":
            packed = base64.b64encode(struct.pack(f"<{len(rows[0])}f", *rows[0])).decode()
            data.append({"embedding": packed, "index": i, "object": "embedding",
                         "encoding_format": "base64"})
        else:
            data.append({"embedding": rows[0], "index": i, "object": "embedding"})
    n_tokens = sum(len(t) for t in prompts)
    named = body.get("model")
    return json_response({
        "model": named if isinstance(named, str) else model.name,
        "object": "list",
        "usage": {"prompt_tokens": n_tokens, "total_tokens": n_tokens},
        "data": data,
    })


async def _native_answer(model: ModelEndpoint, prompts: list[list[int]]) -> Response:
    vectors = await _vectors(model, prompts, 2)
    return json_response([{"index": i, "embedding": v} for i, v in enumerate(vectors)])


def normalize(vector: list[float], norm: int) -> list[float]:
    """common_embd_normalize: -1 none, 0 max-abs scaled to int16, 1 taxicab, 2 euclidean,
    above 2 the p-norm."""
    if norm == -1:
        total = 1.0
    elif norm == 0:
        total = max((abs(v) for v in vector), default=0.0) / 32760.0
    elif norm == 2:
        total = math.sqrt(sum(v * v for v in vector))
    else:
        total = sum(abs(v) ** norm for v in vector) ** (1.0 / norm)
    scale = 1.0 / total if total > 0.0 else 0.0
    return [v * scale for v in vector]
