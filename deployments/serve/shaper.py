"""The response shaper: turns the replica's engine events into llama-server's native objects, or
the OpenAI ones, and SSE frames. It knows nothing of MLX; the replica knows nothing of JSON.

One entry point per transport: ``complete`` (HTTP, one JSON body), ``stream`` (HTTP, SSE bytes;
``push_stream`` carries the same items on a shared channel), ``result`` and ``frames`` (a Python
handle's dict and frame dicts). Each shapes through ``_shape`` and reads ``_events``, which
converts the request to the engine's, once."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

from ray import serve
from ray.serve.handle import DeploymentHandle

from deployments.api.config import GraphArgs
from deployments.api.engine_requests import to_requests
from deployments.api.errors import ApiError, Refusal
from deployments.api.protocols import protocol_shape
from deployments.api.schema import CompletionParams
from deployments.api.shapes import NativeShape, OaiChatShape, OaiCompletionShape, OaiContext, dumps
from deployments.api.tools.stream import ToolChatShape
from deployments.serve import channel, replicas
from deployments.serve.failures import from_failure
from deployments.serve.status import status_board
from deployments.serve.streams import close, coalesce, concat_lists
from engine.types import ErrorEvent, FinalEvent, ProgressEvent, StartEvent, TokenEvent


def _error(ev: ErrorEvent) -> ApiError:
    return ApiError(ev.message, ev.type, ev.code, dict(ev.extra))


@serve.deployment(name="ResponseShaper", max_ongoing_requests=1000)
class ResponseShaper:
    def __init__(self, replica: DeploymentHandle, args: GraphArgs):
        self.shared = channel.shared(args.stream_channel)
        self.replica = args.handle(replica).options(stream=not self.shared)
        self.model_name = args.model_name
        self.n_parallel = args.n_parallel
        self.board = status_board()

    def _events(self, params: CompletionParams, prompts: list[list[int]],
                oai: OaiContext | None):
        """The replica's event batches for the request, converted to the engine's requests here
        (once: the replica gets engine/types.py's GenerationRequests); those that queue up while
        we work arrive as one. A request naming a slot goes to the replica holding it."""
        requests = to_requests(params, prompts, oai.id if oai is not None else "")
        if params.id_slot >= 0 and self.board is not None:
            return self._pinned_events(params, requests)
        return self._replica_events(params, requests)

    async def _pinned_events(self, params: CompletionParams, requests: list):
        await replicas.pin_to_slot(requests, params.id_slot, self.model_name, self.n_parallel,
                                   self.board)
        events = self._replica_events(params, requests)
        try:
            async for batch in events:
                yield batch
        finally:  # a client that left: the replica's stream ends now, not when collected
            await close(events)

    def _replica_events(self, params: CompletionParams, requests: list):
        replica = self.replica
        if params.multiplex_id:  # to a replica holding the request's on-demand adapter
            replica = replica.options(multiplexed_model_id=params.multiplex_id)
        if self.shared:
            return channel.receive(channel.listener(),
                                   lambda reply: replica.push.remote(requests, reply),
                                   concat_lists)
        return coalesce(replica.generate.remote(requests), concat_lists)

    def _shape(self, params: CompletionParams, oai: OaiContext | None):
        if oai is None:
            return NativeShape(params, self.model_name)
        if oai.object == "chat.completion":
            active = oai.chat is not None and oai.chat.active
            chat = ToolChatShape(params, oai) if active else OaiChatShape(params, oai)
            return protocol_shape(oai.protocol, chat) if oai.protocol else chat
        return OaiCompletionShape(params, oai)

    async def result(self, params: CompletionParams, prompts: list[list[int]],
                     oai: OaiContext | None = None) -> tuple[int, Any]:
        """A non-streaming answer: (status, object). Native: one object, or an array ordered by
        index; OpenAI: one object whose choices are in index order; the Responses API: an array;
        an error: its envelope."""
        shape = self._shape(params, oai)
        results: dict[int, dict] = {}
        events = self._events(params, prompts, oai)
        try:
            async for batch in events:
                for ev in batch:
                    if isinstance(ev, ErrorEvent):
                        err = _error(ev)
                        return err.code, err.body()
                    if isinstance(ev, FinalEvent):
                        results[ev.index] = shape.final(ev, stream=False)[0]
        except ApiError as err:  # output the chat format's parser refuses
            return err.code, err.body()
        except Exception as exc:  # the replica died or failed: an envelope, never a hang
            err = from_failure(exc)
            return err.code, err.body()
        finally:
            if len(results) < len(prompts) * params.n_cmpl:
                await close(events)  # cancelled or failed here: the replica stops generating too
        ordered = [results[i] for i in sorted(results)]
        if len(ordered) == 1:
            return 200, ordered[0]
        return 200, shape.merge(ordered)

    async def complete(self, params: CompletionParams, prompts: list[list[int]],
                       oai: OaiContext | None = None) -> tuple[int, bytes]:
        """``result`` as the HTTP body: (status, JSON bytes)."""
        status, body = await self.result(params, prompts, oai)
        return status, dumps(body)

    async def frames(self, params: CompletionParams, prompts: list[list[int]],
                     oai: OaiContext | None = None) -> AsyncIterator[list[dict]]:
        """The stream frames for Python callers, one list per batch of events: what ``stream``
        sends as SSE, less the ``data: null`` markers between prompts. An error is the last
        frame, ``{"error": {...}}``."""
        shape = self._shape(params, oai)
        async for batch in self._events(params, prompts, oai):
            out: list[dict] = []
            try:
                error = self._shape_batch(shape, params, batch, out, encode=None)
            except ApiError as err:  # output the chat format's parser refuses
                error = err
            if error is not None:
                yield [*out, error.body()]
                return
            if out:
                yield out

    async def stream(self, params: CompletionParams, prompts: list[list[int]],
                     oai: OaiContext | None = None) -> AsyncIterator[bytes | Refusal]:
        """SSE bytes, one chunk per batch of events. If the request fails before a slot took it,
        the only item is a Refusal: the reference then answers plain JSON. Once a
        sequence has started, errors are frames. The OpenAI formats end with ``data: [DONE]``."""
        shape = self._shape(params, oai)
        started = False
        frames = self._frames(shape, params, prompts, oai)
        try:
            async for item in frames:
                started = started or not isinstance(item, Refusal)
                yield item
        except Exception as exc:  # the replica died or failed mid-request
            err = from_failure(exc)
            body = err.body()
            yield shape.encode_error(body) if started else Refusal(err.code, dumps(body))
        finally:
            await frames.aclose()  # a cancelled stream cancels its replica call at once

    async def channel_state(self) -> dict:
        """What this process's stream-channel listener has received
        (deployments/serve/channel.py)."""
        return channel.listener().state()

    async def push_stream(self, params: CompletionParams, prompts: list[list[int]],
                          oai: OaiContext | None, reply: channel.ReplyTo) -> int:
        """``stream``'s items sent on the shared channel to ``reply``'s listener (the
        ingress's process); returns how many, once the request has ended."""
        return await channel.pump(self.stream(params, prompts, oai), channel.sender(), reply)

    async def _frames(self, shape, params: CompletionParams, prompts: list[list[int]],
                      oai: OaiContext | None) -> AsyncIterator[bytes | Refusal]:
        started = ended = False
        events = self._events(params, prompts, oai)
        try:
            async for batch in events:
                chunks: list[bytes] = []
                try:
                    error = self._shape_batch(shape, params, batch, chunks, shape.encode)
                except ApiError as err:  # output the chat format's parser refuses: no [DONE]
                    error = err
                if error is not None:
                    ended = True  # the replica ends a request at its first error
                    if not started and not chunks:
                        yield Refusal(error.code, dumps(error.body()))
                        return
                    chunks.append(shape.encode_error(error.body()))
                    yield b"".join(chunks)
                    return
                if chunks:
                    started = True
                    yield b"".join(chunks)
            ended = True
        finally:
            if not ended:  # closed early (the client went away): the replica stops too
                await close(events)
        if shape.done:
            yield shape.done

    @staticmethod
    def _shape_batch(shape, params: CompletionParams, batch: list, out: list,
                     encode: Callable[[dict], bytes] | None) -> ApiError | None:
        """One batch of events as frames appended to ``out``: SSE chunks with ``encode``, the
        frame dicts without it (and without the start markers). Returns the error that ends the
        stream."""
        for ev in batch:
            frames: list[dict] = []
            if isinstance(ev, StartEvent):
                if encode is not None:
                    out.append(start_marker(ev.index, params))
            elif isinstance(ev, TokenEvent):
                frames = shape.token(ev)
            elif isinstance(ev, ProgressEvent):
                frames = shape.progress(ev)
            elif isinstance(ev, FinalEvent):
                frames = shape.final(ev, stream=True)
            elif isinstance(ev, ErrorEvent):
                return _error(ev)
            out += frames if encode is None else [encode(f) for f in frames]
        return None


def start_marker(index: int, p: CompletionParams) -> bytes:
    """The reference consumes the first task's start marker; a later prompt's is sent as the
    literal ``data: null`` (n_cmpl children have none, progress frames replace them)."""
    later_prompt = index > 0 and index % p.n_cmpl == 0
    return b"data: null\n\n" if later_prompt and not p.return_progress else b""
