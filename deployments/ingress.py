"""The ingress: llama-server's HTTP routes (FastAPI), request validation and the error envelope.

(serve.ingress pickles the class when it is decorated: helpers it calls must be defined above it.)

Everything a request can be refused for is checked here, before anything is queued: the JSON,
the schema, the prompt's tokens and its length. The tokenizer is loaded here too (no model).
"""


import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import Response, StreamingResponse
from ray import serve
from ray.serve.handle import DeploymentHandle
from starlette.exceptions import HTTPException as StarletteHTTPException

from engine.scheduler import check_prompt
from engine.types import EngineError
from engine.vocab import Vocab, load_vocab

from .config import GraphArgs
from .errors import ApiError, invalid
from .schema import (
    CompletionParams,
    ParseContext,
    f32,
    json_type,
    parse_completion,
    split_prompts,
)
from .shapes import dumps

JSON = "application/json; charset=utf-8"
PUBLIC_PATHS = {"/health", "/v1/health"}

app = FastAPI(title="mlxray", description="llama-server's HTTP API on MLX and Ray Serve",
              docs_url=None, redoc_url=None)


def json_response(body: Any, status: int = 200) -> Response:
    return Response(dumps(body), status_code=status, media_type=JSON)


def error_response(err: ApiError) -> Response:
    return Response(dumps(err.body()), status_code=err.code, media_type=JSON)


@app.exception_handler(ApiError)
async def _api_error(request: Request, err: ApiError) -> Response:
    return error_response(err)


@app.exception_handler(StarletteHTTPException)
async def _http_error(request: Request, exc: StarletteHTTPException) -> Response:
    if exc.status_code in (404, 405):
        return error_response(ApiError("File Not Found", "not_found_error", middleware=True))
    return error_response(ApiError(str(exc.detail), "invalid_request_error", exc.status_code))


def from_engine(exc: EngineError) -> ApiError:
    return ApiError(exc.message, exc.type, exc.code, dict(exc.extra))


async def read_json(request: Request, limit: int) -> Any:
    body = await request.body()
    if len(body) > limit:
        raise ApiError(f"request body too large: {len(body)} bytes (limit {limit})",
                       "invalid_request_error", 413)
    try:
        return json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        line, col = (exc.lineno, exc.colno) if isinstance(exc, json.JSONDecodeError) else (1, 1)
        raise invalid(f"[json.exception.parse_error.101] parse error at line {line}, column {col}: "
                      f"syntax error while parsing value - {exc}") from None


def _flag(body: dict, key: str, default: bool) -> bool:
    value = body.get(key, default)
    return value if isinstance(value, bool) else default


async def _with_pings(first, chunks, interval: int) -> AsyncIterator[bytes]:
    """The SSE body; a ``:`` comment line after ``interval`` seconds of silence keeps it open."""
    if first is not None:
        yield first
    iterator = chunks.__aiter__()
    pending: asyncio.Future | None = None
    try:
        while True:
            if pending is None:
                pending = asyncio.ensure_future(anext(iterator, None))
            if interval > 0:
                done, _ = await asyncio.wait({pending}, timeout=interval)
                if not done:
                    yield b":\n\n"
                    continue
            chunk = await pending
            pending = None
            if chunk is None:
                return
            yield chunk
    finally:
        if pending is not None and not pending.done():
            pending.cancel()


@serve.deployment(name="Ingress", max_ongoing_requests=1000)
@serve.ingress(app)
class Ingress:
    def __init__(self, shaper: DeploymentHandle, replica: DeploymentHandle, args: GraphArgs):
        self.shaper = shaper
        self.replica = replica
        self.args = args
        self.vocab: Vocab = load_vocab(args.model_path)
        self.defaults = CompletionParams(
            temperature=f32(args.temperature), seed=args.seed, n_predict=args.n_predict,
            cache_prompt=args.cache_prompt,
        )
        self.parse_context = ParseContext(
            n_parallel=args.n_parallel,
            tokenize=lambda text: self.vocab.tokenize(text, add_special=False),
            n_vocab=self.vocab.n_vocab,
            eog_ids=tuple(sorted(self.vocab.eog_ids)),
        )
        self._ready = False

    async def _check_ready(self) -> None:
        if not self._ready:
            self._ready = await self.replica.ready.remote()
            if not self._ready:
                raise ApiError("Loading model", "unavailable_error", middleware=True)

    def _check_key(self, request: Request) -> None:
        key = self.args.api_key
        if not key or request.url.path in PUBLIC_PATHS or request.method == "OPTIONS":
            return
        auth = request.headers.get("authorization", "")
        given = auth[7:] if auth.lower().startswith("bearer ") else request.headers.get("x-api-key")
        if given != key:
            raise ApiError("Invalid API Key", "authentication_error", middleware=True)

    async def _guard(self, request: Request) -> None:
        await self._check_ready()
        self._check_key(request)

    # ---- completion ------------------------------------------------------------------------
    @app.post("/completion")
    @app.post("/completions")
    async def completion(self, request: Request) -> Response:
        await self._guard(request)
        body = await read_json(request, self.args.max_body_bytes)
        params, prompts = self._prepare(body)
        if params.stream:
            return await self._stream(params, prompts)
        status, payload = await self.shaper.complete.remote(params, prompts)
        return Response(payload, status_code=status, media_type=JSON)

    def _prepare(self, body: Any) -> tuple[CompletionParams, list[list[int]]]:
        """The reference's order: prompt present, tokenized, fields evaluated, then slot checks."""
        if not isinstance(body, dict):
            raise invalid(f"[json.exception.type_error.304] cannot use at() with {json_type(body)}")
        try:
            prompts = [self.vocab.tokenize_prompt(p) for p in split_prompts(body)]
            params = parse_completion(body, self.parse_context, self.defaults)
            for tokens in prompts:
                check_prompt(tokens, self.vocab.n_vocab, self.args.n_ctx)
        except EngineError as exc:
            raise from_engine(exc) from None
        return params, prompts

    async def _stream(self, params: CompletionParams, prompts: list[list[int]]) -> Response:
        chunks = self.shaper.options(stream=True).stream.remote(params, prompts)
        first = await anext(chunks, None)
        if isinstance(first, tuple):
            status, payload = first
            return Response(payload, status_code=status, media_type=JSON)
        return StreamingResponse(
            _with_pings(first, chunks, params.sse_ping_interval),
            media_type="text/event-stream",
            headers={"X-Accel-Buffering": "no"},
        )

    # ---- tokens ----------------------------------------------------------------------------
    @app.post("/tokenize")
    async def tokenize(self, request: Request) -> Response:
        await self._guard(request)
        body = await read_json(request, self.args.max_body_bytes)
        if not isinstance(body, dict):
            raise invalid("request body must be a JSON object")
        content = body.get("content")
        add_special = _flag(body, "add_special", False)
        parse_special = _flag(body, "parse_special", True)
        with_pieces = _flag(body, "with_pieces", False)
        if content is None:
            return json_response({"tokens": []})
        try:
            if isinstance(content, str):
                tokens = self.vocab.tokenize(content, add_special, parse_special)
            elif isinstance(content, list):
                tokens = self.vocab.tokenize_mixed(content, add_special, parse_special)
            else:
                raise invalid("\"content\" must be a string or an array of strings and tokens")
        except EngineError as exc:
            raise invalid(exc.message) from None
        if not with_pieces:
            return json_response({"tokens": tokens})
        out = []
        for t in tokens:
            piece = self.vocab.piece(t, special=True)
            try:
                shown: Any = piece.decode("utf-8")
            except UnicodeDecodeError:
                shown = list(piece)
            out.append({"id": t, "piece": shown})
        return json_response({"tokens": out})

    @app.post("/detokenize")
    async def detokenize(self, request: Request) -> Response:
        await self._guard(request)
        body = await read_json(request, self.args.max_body_bytes)
        if not isinstance(body, dict):
            raise invalid("request body must be a JSON object")
        tokens = body.get("tokens", [])
        if tokens is None:
            tokens = []
        if not isinstance(tokens, list) or not all(
            isinstance(t, int) and not isinstance(t, bool) for t in tokens
        ):
            raise invalid("\"tokens\" must be an array of integers")
        return json_response({"content": self.vocab.detokenize(tokens, special=True)})

    # ---- health ----------------------------------------------------------------------------
    @app.get("/health")
    @app.get("/v1/health")
    async def health(self, request: Request) -> Response:
        await self._check_ready()
        return json_response({"status": "ok"})
