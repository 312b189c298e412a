"""The response shaper: turns the replica's engine events into llama-server's native objects and
SSE frames. It knows nothing of MLX; the replica knows nothing of JSON."""

from __future__ import annotations

from collections.abc import AsyncIterator

from ray import serve
from ray.serve.handle import DeploymentHandle

from engine.types import ErrorEvent, FinalEvent, ProgressEvent, StartEvent, TokenEvent

from .config import GraphArgs
from .errors import ApiError
from .schema import CompletionParams
from .shapes import dumps, final_result, progress_frame, sse, token_frame


def _error(ev: ErrorEvent) -> ApiError:
    return ApiError(ev.message, ev.type, ev.code, dict(ev.extra))


@serve.deployment(name="ResponseShaper", max_ongoing_requests=1000)
class ResponseShaper:
    def __init__(self, replica: DeploymentHandle, args: GraphArgs):
        self.replica = replica.options(stream=True)
        self.model_name = args.model_name

    def _events(self, params: CompletionParams, prompts: list[list[int]]):
        return self.replica.generate.remote(params, prompts)

    async def complete(self, params: CompletionParams,
                       prompts: list[list[int]]) -> tuple[int, bytes]:
        """A non-streaming answer: (status, JSON body); one object, or an array ordered by index."""
        results: dict[int, dict] = {}
        async for batch in self._events(params, prompts):
            for ev in batch:
                if isinstance(ev, ErrorEvent):
                    err = _error(ev)
                    return err.code, dumps(err.body())
                if isinstance(ev, FinalEvent):
                    results[ev.index] = final_result(ev, params, self.model_name, stream=False)
        ordered = [results[i] for i in sorted(results)]
        return 200, dumps(ordered[0] if len(ordered) == 1 else ordered)

    async def stream(self, params: CompletionParams,
                     prompts: list[list[int]]) -> AsyncIterator[bytes | tuple[int, bytes]]:
        """SSE bytes, one chunk per batch of events. If the request fails before a slot took it,
        the only item is (status, JSON error body): the reference then answers plain JSON. Once a
        sequence has started, errors are frames."""
        started = False
        async for batch in self._events(params, prompts):
            chunks: list[bytes] = []
            for ev in batch:
                if isinstance(ev, StartEvent):
                    started = True
                    chunks.append(start_marker(ev.index, params))
                elif isinstance(ev, TokenEvent):
                    chunks.append(sse(token_frame(ev, params)))
                elif isinstance(ev, ProgressEvent):
                    chunks.append(sse(progress_frame(ev)))
                elif isinstance(ev, FinalEvent):
                    chunks.append(sse(final_result(ev, params, self.model_name, stream=True)))
                elif isinstance(ev, ErrorEvent):
                    err = _error(ev)
                    if not started and not chunks:
                        yield err.code, dumps(err.body())
                        return
                    chunks.append(sse(err.body()))
                    yield b"".join(chunks)
                    return
            if chunks:
                started = True
                yield b"".join(chunks)


def start_marker(index: int, p: CompletionParams) -> bytes:
    """The reference consumes the first task's start marker; a later prompt's is sent as the
    literal ``data: null`` (n_cmpl children have none, progress frames replace them)."""
    later_prompt = index > 0 and index % p.n_cmpl == 0
    return b"data: null\n\n" if later_prompt and not p.return_progress else b""
