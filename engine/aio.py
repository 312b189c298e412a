"""The async side of the engine: submit a group, await its events in batches.

Each batch holds everything that was ready when the consumer asked (the queue is drained), so an
idle stream gets its first token at once and a busy one carries many tokens per item.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from .scheduler import Engine
from .types import EngineEvent, ErrorEvent, FinalEvent, GenerationRequest


async def generate(
    engine: Engine, requests: list[GenerationRequest]
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
    try:
        while remaining > 0:
            batch = await inbox.get()
            while not inbox.empty():
                batch = batch + inbox.get_nowait()
            remaining -= sum(1 for e in batch if isinstance(e, (FinalEvent, ErrorEvent)))
            yield batch
            if any(isinstance(e, ErrorEvent) for e in batch):
                break  # the reference stops the whole request at its first error
    finally:
        if remaining > 0:
            engine.cancel(group_id)
