"""Where resumable streams live (deployments/api/stream_sessions.py): one Ray actor per
application, named, so that every ingress replica reads and writes the same sessions, and a
stream begun through one replica resumes through another. The first ingress replica that needs it
starts it (no CPU reserved; it lives as long as that replica, and the next caller starts a new one
if it dies). Without Ray (tests/local_graph.py) the sessions live in the process.

``produce`` is the tee: it reads the shaper's SSE chunks in a context of its own, so that Ray
Serve does not cancel the call when the client's request ends, and hands each chunk both to the
live HTTP response (a queue) and to the session; a dropped client leaves it running to the end,
``DELETE /v1/stream`` stops it (the next chunk is refused and the call closed: the slot frees)."""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import AsyncIterator, Callable
from typing import Any

from deployments.api.errors import Refusal
from deployments.api.stream_sessions import OffsetLost, StreamSessions
from deployments.serve.streams import close

GC_INTERVAL_S = 60  # the reference's STREAM_SESSION_GC_INTERVAL_SECONDS
READ_WAIT_S = 0.2  # STREAM_READ_WAKE_INTERVAL_MS: how long one read waits for new bytes


class StreamStore:
    """The sessions behind async methods, as the actor serves them."""

    def __init__(self) -> None:
        self.sessions = StreamSessions()
        self._gc: asyncio.Task | None = None

    def _collect_later(self) -> None:
        if self._gc is None:
            self._gc = asyncio.get_running_loop().create_task(self._collect())

    async def _collect(self) -> None:
        while True:
            await asyncio.sleep(GC_INTERVAL_S)
            self.sessions.collect()

    async def open(self, conversation_id: str) -> int:
        self._collect_later()
        return self.sessions.open(conversation_id)

    async def append(self, conversation_id: str, generation: int, data: bytes) -> bool:
        return self.sessions.append(conversation_id, generation, data)

    async def finish(self, conversation_id: str, generation: int, keep: bool = True) -> None:
        self.sessions.finish(conversation_id, generation, keep)

    async def dropped(self, conversation_id: str) -> int | None:
        """How many bytes the session has dropped from its front; None: no such session."""
        session = self.sessions.get(conversation_id)
        return None if session is None else session.dropped

    async def read(self, conversation_id: str, offset: int) -> tuple[bytes, bool]:
        """The bytes from ``offset`` (waiting a little for some), and whether the reader is done:
        the session ended (and all is read), was dropped, or left the offset behind."""
        session = self.sessions.get(conversation_id)
        if session is None:
            return b"", True
        await session.wait(offset, READ_WAIT_S)
        if self.sessions.get(conversation_id) is not session:
            return b"", True
        try:
            data = session.read(offset)
        except OffsetLost:
            return b"", True
        return data, session.done and not data

    async def lookup(self, requested: list[str]) -> list[dict]:
        return self.sessions.lookup(requested)

    async def stop(self, conversation_id: str) -> None:
        self.sessions.stop(conversation_id)


class _Local:
    """The store in this process, called as the actor is (``method.remote(...)``)."""

    def __init__(self) -> None:
        self.store = StreamStore()

    def __getattr__(self, name: str) -> Any:
        method = getattr(self.store, name)
        return type("Method", (), {"remote": staticmethod(method)})


_cached: Any = None


def store() -> Any:
    """This application's store: the named actor on a Ray cluster, else one in the process."""
    global _cached
    if _cached is None:
        _cached = _actor() if _on_ray() else _Local()
    return _cached


def forget() -> None:
    """After the actor died: the next ``store()`` starts (or finds) a new one."""
    global _cached
    _cached = None


def _on_ray() -> bool:
    import ray

    return ray.is_initialized()


def _actor() -> Any:
    import ray
    from ray import serve

    try:
        app = serve.get_replica_context().app_name
    except Exception:  # a driver, not a replica
        app = "default"
    actor = ray.remote(StreamStore).options(
        name=f"mlxray-streams:{app}", get_if_exists=True, num_cpus=0, max_concurrency=1000)
    return actor.remote()


async def call(method: str, *args: Any) -> Any:
    """One store call; a store that died is started again once."""
    from ray.exceptions import RayActorError

    try:
        return await getattr(store(), method).remote(*args)
    except RayActorError:
        forget()
        return await getattr(store(), method).remote(*args)


def produce(sse: Callable[[], AsyncIterator[bytes | Refusal]], conversation_id: str,
            generation: int) -> asyncio.Queue:
    """Start the tee; returns the queue the live response reads: chunks, a Refusal, or an
    exception, then None at the end."""
    queue: asyncio.Queue = asyncio.Queue()
    # a context of its own: Serve cancels the calls a request made when the request ends
    contextvars.Context().run(asyncio.ensure_future,
                              _tee(sse, conversation_id, generation, queue))
    return queue


async def _tee(sse: Callable[[], AsyncIterator[bytes | Refusal]], conversation_id: str,
               generation: int, queue: asyncio.Queue) -> None:
    chunks, keep, ended = sse(), True, False
    try:
        async for item in chunks:
            queue.put_nowait(item)
            if isinstance(item, Refusal):  # nothing was streamed: nothing to resume
                keep = False
                continue
            if not await call("append", conversation_id, generation, item):
                return  # stopped (DELETE) or replaced by a newer stream of the conversation
        ended = True
    except Exception as exc:  # the shaper or the replica failed
        queue.put_nowait(exc)
    finally:
        if not ended:
            await close(chunks)
        queue.put_nowait(None)
        await call("finish", conversation_id, generation, keep)


async def drain(queue: asyncio.Queue) -> AsyncIterator[bytes]:
    """The live response's chunks from the tee's queue."""
    while (item := await queue.get()) is not None:
        if isinstance(item, BaseException):
            raise item
        yield item


async def follow(conversation_id: str, offset: int) -> AsyncIterator[bytes]:
    """GET /v1/stream's body: the session's bytes from ``offset``, then its live ones."""
    while True:
        data, done = await call("read", conversation_id, offset)
        if data:
            offset += len(data)
            yield data
        elif done:
            return
