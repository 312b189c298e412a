"""The ingress's shared state and guards; route mixins in ``deployments/serve/routes`` build on it.

An application serves one model or several (``GraphArgs.models``). Each is a ``ModelEndpoint``:
its settings, tokenizer and chat template, and the handles of its shaper and replica. A request
names its model in its ``model`` field (a GET request: the ``model`` query parameter), as clients
of llama-server's router mode do; one that names none goes to the first model. With a single
model, ``model`` is ignored, as llama-server ignores it outside router mode.
"""

import hmac
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from fastapi import Request
from ray.serve.handle import DeploymentHandle

from deployments.api import router_models
from deployments.api.adapters import AdapterTable
from deployments.api.chat_template import ChatTemplate
from deployments.api.config import GraphArgs
from deployments.api.cors import CorsPolicy
from deployments.api.defaults import server_defaults
from deployments.api.errors import ApiError, Refusal, invalid
from deployments.api.model_entries import oai_entry
from deployments.api.schema import CompletionParams, ParseContext
from deployments.api.shapes import OaiContext
from deployments.serve import channel, direct_ingress, replicas
from deployments.serve.app import CorsMiddleware
from deployments.serve.model_router import HELD, ModelRouter
from deployments.serve.streams import coalesce, concat_bytes
from engine.vocab import Vocab, load_vocab

PUBLIC_PATHS = {"/health", "/v1/health"}


class ModelEndpoint:
    """One model of the application, as the ingress sees it."""

    def __init__(self, shaper: DeploymentHandle, replica: DeploymentHandle, args: GraphArgs,
                 vocab: Vocab):
        self.shaper = shaper
        self.replica = replica
        self.args = args
        self.shared_channel = channel.shared(args.stream_channel)
        self.vocab = vocab
        self.defaults = server_defaults(
            args.sampling, args.temperature, args.seed, args.n_predict,
            cache_prompt=args.cache_prompt, reasoning_format=args.reasoning_format,
            reasoning_budget_tokens=args.reasoning_budget_tokens,
            speculative_types=args.spec_type,
        )
        self.parse_context = ParseContext(
            n_parallel=args.n_parallel,
            tokenize=lambda text: vocab.tokenize(text, add_special=False),
            n_vocab=vocab.n_vocab,
            eog_ids=tuple(sorted(vocab.eog_ids)),
        )
        self.chat = ChatTemplate(vocab.hf, args.template_source(), args.chat_template_kwargs)
        self.adapters = AdapterTable(args)
        self.special_token = lambda text: _special_token(vocab, text)
        self._ready = False
        self._model_info: dict | None = None

    @property
    def name(self) -> str:
        return self.args.model_name

    def sse(self, params: CompletionParams, prompts: list[list[int]],
            oai: OaiContext | None) -> AsyncIterator[bytes | Refusal]:
        """The shaper's ``stream`` items (SSE chunks, or one Refusal); those that
        queue up while the client reads arrive as one."""
        if self.shared_channel:
            shaper = self.shaper
            return channel.receive(
                channel.listener(),
                lambda reply: shaper.push_stream.remote(params, prompts, oai, reply),
                concat_bytes)
        return coalesce(self.shaper.options(stream=True).stream.remote(params, prompts, oai),
                        concat_bytes)

    async def check_ready(self) -> None:
        """503 "Loading model" until the replica has its model."""
        if not self._ready:
            self._ready = await self.replica.ready.remote()
            if not self._ready:
                raise ApiError("Loading model", "unavailable_error", middleware=True)

    async def model_info(self) -> dict:
        """The loaded model's figures (the replica's model_info), asked once."""
        if self._model_info is None:
            self._model_info = await self.replica.model_info.remote()
        return self._model_info


def _special_token(vocab: Vocab, text: str) -> int | None:
    """The id of ``text`` when it is one special token of the vocabulary."""
    ids = vocab.tokenize(text, add_special=False)
    return ids[0] if len(ids) == 1 and ids[0] in vocab.special_ids else None


ModelStack = tuple[DeploymentHandle, DeploymentHandle, GraphArgs]


class IngressBase:
    def __init__(self, models: list[ModelStack], args: GraphArgs,
                 board: DeploymentHandle | None = None):
        direct_ingress.reclaimable_port()
        self.args = args  # the application's: api_key, max_body_bytes, webui (and defaults)
        CorsMiddleware.use(CorsPolicy(args.cors_origins, args.cors_methods, args.cors_headers,
                                      args.cors_credentials))
        self.board = board  # deployments/serve/status.py: every replica's state, for /mlxray/status
        vocabs: dict[str, Vocab] = {}
        self.models: list[ModelEndpoint] = []
        for shaper, replica, model_args in models:
            path = model_args.model_path
            if path not in vocabs:  # the same weights under several names share a tokenizer
                vocabs[path] = load_vocab(path)
            self.models.append(ModelEndpoint(model_args.handle(shaper), model_args.handle(replica),
                                             model_args, vocabs[path]))
        self.by_name = {name: m for m in self.models for name in (*m.args.aliases, m.name)}
        self.api_keys = api_keys(args)
        self.started = time.time()
        self.router = self._router() if args.routed else None

    def _router(self) -> ModelRouter:
        board = self.board

        async def unload_each(name: str) -> list[dict]:
            answers = await replicas.ask_each(self.by_name[name], board, "unload")
            return [a.answer for a in answers]

        async def describe(name: str) -> dict:
            model = self.by_name[name]
            return oai_entry(model.args, await model.model_info(), int(time.time()), name)

        sleeps = [m.args.sleep_idle_seconds for m in self.models if m.args.sleep_idle_seconds > 0]
        router = ModelRouter({m.name: m.replica for m in self.models}, self.args.models_max,
                             self.args.models_autoload, unload_each, describe,
                             sleep_poll_s=min(1.0, min(sleeps) / 4) if sleeps else None)
        router.load_at_start([m.name for m in self.models if m.args.load_on_startup])
        return router

    def select(self, name: Any) -> ModelEndpoint:
        """The model a request names, or the model of the LoRA adapter it names (models are
        matched first); the first one when it names none (a missing, empty or non-string
        ``model``). An unknown name is the router's 400 (ignored with a single model)."""
        if not isinstance(name, str) or not name:
            return self.models[0]
        model = self.by_name.get(name) or next(
            (m for m in self.models if m.adapters and m.adapters.find(name)), None)
        if model is not None or len(self.models) == 1:
            return model or self.models[0]
        raise invalid(f"model '{name}' not found")

    async def model_of(self, body: Any, request: Request | None = None) -> ModelEndpoint:
        """The model of a request: its body's ``model``, else its ``model`` query parameter. In
        router mode it is required, and loaded first (``?autoload=`` or models_autoload)."""
        name = body.get("model") if isinstance(body, dict) else None
        query = request.query_params if request is not None else {}
        if name is None:
            name = query.get("model")
        if self.router is None:
            return self.select(name)
        if not isinstance(name, str) or not name:
            raise router_models.missing_model()
        model = self.select(name)
        autoload = router_models.wants_autoload(query.get("autoload"), self.args.models_autoload)
        await self.router.ensure(model.name, autoload, wakes=isinstance(body, dict))
        held = HELD.get()
        if held is not None:
            self.router.hold(model.name)
            held.append(lambda: self.router.release(model.name))
        return model

    async def check_ready(self) -> None:
        """503 "Loading model" on every route until every model is loaded (in router mode
        models load on demand: model_of waits for the request's)."""
        if self.router is not None:
            return
        for model in self.models:
            await model.check_ready()

    def check_key(self, request: Request) -> None:
        """``Authorization: Bearer <key>`` or ``X-Api-Key``; ``api_key`` may list several keys,
        comma-separated, as llama-server's ``--api-key`` does."""
        keys = self.api_keys
        if not keys or request.url.path in PUBLIC_PATHS or request.method == "OPTIONS":
            return
        auth = request.headers.get("authorization", "")
        given = auth[7:] if auth.lower().startswith("bearer ") else request.headers.get("x-api-key")
        if not _known(given, keys):
            raise ApiError("Invalid API Key", "authentication_error", middleware=True)

    async def guard(self, request: Request) -> None:
        await self.check_ready()
        self.check_key(request)


def _known(given: str | None, keys: list[str]) -> bool:
    """Constant-time against each key (every key compared, so the time tells nothing)."""
    given_b = (given or "").encode()
    found = False
    for key in keys:
        found |= hmac.compare_digest(given_b, key.encode())
    return found and bool(given)


def api_keys(args: GraphArgs) -> list[str]:
    """``api_key``'s keys (comma-separated) and ``api_key_file``'s: each line that is not empty
    and does not start with ``#``, taken as it is (llama-server's --api-key-file)."""
    keys = [k for k in (args.api_key or "").split(",") if k]
    if args.api_key_file:
        lines = Path(args.api_key_file).read_text().splitlines()
        keys += [line for line in lines if line and not line.startswith("#")]
    return keys
