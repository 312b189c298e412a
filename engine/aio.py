"""The async side of the engine: submit a group, await its events in batches.

Each batch holds everything that was ready when the consumer asked (the queue is drained), so an
idle stream gets its first token at once and a busy one carries many tokens per item. With a
``min_interval_s``, tokens after the first gather for at least that long before the next batch:
every batch costs a Ray round trip per deployment hop, so fewer, fuller batches leave the CPU to
the engine (the first token and the final event are never held back).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from .scheduler import Engine
from .types import EngineEvent, ErrorEvent, FinalEvent, GenerationRequest, TokenEvent


async def generate(
    engine: Engine, requests: list[GenerationRequest], min_interval_s: float = 0.0
) -> AsyncIterator[list[EngineEvent]]:
    """Yield lists of events until every request of the group has its final or error event.

    Closing the iterator early (a client that went away) cancels the group in the engine.
    """
    loop = asyncio.get_running_loop()
    inbox: asyncio.Queue[list[EngineEvent]] = asyncio.Queue()

    def sink(events: list[EngineEvent]) -> None:
        loop.call_soon_threadsafe(inbox.put_nowait, events)

    group_id = engine.submit(requests, sink)
    remaining = len(requests)
    last_token_batch: float | None = None
    try:
        while remaining > 0:
            batch = await inbox.get()
            if last_token_batch is not None and not _ends(batch):
                wait = last_token_batch + min_interval_s - loop.time()
                if wait > 0:
                    await asyncio.sleep(wait)
            while not inbox.empty():
                batch = batch + inbox.get_nowait()
            remaining -= sum(1 for e in batch if isinstance(e, (FinalEvent, ErrorEvent)))
            yield batch
            if min_interval_s > 0 and any(isinstance(e, TokenEvent) for e in batch):
                last_token_batch = loop.time()
            if any(isinstance(e, ErrorEvent) for e in batch):
                break  # the reference stops the whole request at its first error
    finally:
        if remaining > 0:
            engine.cancel(group_id)


def _ends(batch: list[EngineEvent]) -> bool:
    return any(isinstance(e, (FinalEvent, ErrorEvent)) for e in batch)
