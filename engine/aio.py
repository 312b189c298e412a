"""The async side of the engine: submit a group, await its events in batches.

Each batch holds everything that was ready when the consumer asked (the queue is drained), so an
idle stream gets its first token at once. Tokens after the first gather for a while (``Gather``)
before the next batch: every batch costs a Ray round trip per deployment hop, so fewer, fuller
batches leave the CPU to the engine; and the streams' batches leave on common ticks, so that
they share frames. The first token and a final event are never held back (a
final event ends the gather that was waiting for more tokens).
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import AsyncIterator

from .seam import EngineLike
from .types import EngineEvent, ErrorEvent, FinalEvent, Gather, GenerationRequest, TokenEvent


async def generate(
    engine: EngineLike, requests: list[GenerationRequest], gather: Gather = Gather()
) -> AsyncIterator[list[EngineEvent]]:
    """Yield lists of events until every request of the group has its final or error event.

    Closing the iterator early (a client that went away) cancels the group in the engine.
    """
    loop = asyncio.get_running_loop()
    inbox: asyncio.Queue[list[EngineEvent]] = asyncio.Queue()
    ended = asyncio.Event()  # a final or error event is waiting: a gather ends at once

    def put(events: list[EngineEvent]) -> None:
        inbox.put_nowait(events)
        if _ends(events):
            ended.set()

    def sink(events: list[EngineEvent]) -> None:
        loop.call_soon_threadsafe(put, events)

    if any(req.grammar for req in requests):  # a new grammar compiles for a while: off the loop
        await asyncio.to_thread(_validate, engine, requests)
    group_id = engine.submit(requests, sink)
    remaining = len(requests)
    last_token_batch: float | None = None
    try:
        while remaining > 0:
            batch = await inbox.get()
            if last_token_batch is not None and not _ends(batch):
                wait = next_tick(last_token_batch, gather.interval(engine.n_active)) - loop.time()
                if wait > 0 and not ended.is_set():
                    try:
                        await asyncio.wait_for(ended.wait(), wait)
                    except asyncio.TimeoutError:
                        pass
            while not inbox.empty():
                batch = batch + inbox.get_nowait()
            ended.clear()  # set again by a later prompt's end (a group ends in several events)
            remaining -= sum(1 for e in batch if isinstance(e, (FinalEvent, ErrorEvent)))
            yield batch
            if not gather.off and any(isinstance(e, TokenEvent) for e in batch):
                last_token_batch = loop.time()
            if any(isinstance(e, ErrorEvent) for e in batch):
                break  # the reference stops the whole request at its first error
    finally:
        if remaining > 0:
            engine.cancel(group_id)


def next_tick(last: float, interval: float) -> float:
    """When a stream's next batch leaves: on the loop clock's grid of ``interval``, at least half
    an interval after its last one. Streams then leave on the same ticks, in one loop turn, and
    a shared channel (deployments/serve/channel.py) carries them all in one frame."""
    if interval <= 0:
        return last
    return math.ceil((last + interval / 2) / interval) * interval


def _ends(batch: list[EngineEvent]) -> bool:
    return any(isinstance(e, (FinalEvent, ErrorEvent)) for e in batch)


def _validate(engine: EngineLike, requests: list[GenerationRequest]) -> None:
    """What submit checks first, the grammar's compilation (then cached) included."""
    for req in requests:
        engine.validate(req)
