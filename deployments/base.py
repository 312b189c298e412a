"""The ingress's shared state and guards; route mixins in ``deployments/routes`` build on it."""

import time

from fastapi import Request
from ray.serve.handle import DeploymentHandle

from engine.vocab import Vocab, load_vocab

from .chat import ChatTemplate
from .config import GraphArgs
from .errors import ApiError
from .schema import CompletionParams, ParseContext, f32

PUBLIC_PATHS = {"/health", "/v1/health"}


class IngressBase:
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
        self.chat = ChatTemplate(self.vocab.hf)
        self.started = time.time()
        self._ready = False
        self._model_info: dict | None = None

    async def check_ready(self) -> None:
        """503 "Loading model" on every route until the replica has its model."""
        if not self._ready:
            self._ready = await self.replica.ready.remote()
            if not self._ready:
                raise ApiError("Loading model", "unavailable_error", middleware=True)

    async def model_info(self) -> dict:
        """The loaded model's figures (the replica's model_info), asked once."""
        if self._model_info is None:
            self._model_info = await self.replica.model_info.remote()
        return self._model_info

    def check_key(self, request: Request) -> None:
        key = self.args.api_key
        if not key or request.url.path in PUBLIC_PATHS or request.method == "OPTIONS":
            return
        auth = request.headers.get("authorization", "")
        given = auth[7:] if auth.lower().startswith("bearer ") else request.headers.get("x-api-key")
        if given != key:
            raise ApiError("Invalid API Key", "authentication_error", middleware=True)

    async def guard(self, request: Request) -> None:
        await self.check_ready()
        self.check_key(request)
