"""Read-ahead between deployments: each hop forwards everything that is ready as one item.

A Ray streaming call costs a round trip per item, so a hop that forwarded its upstream's items one
by one would cap the graph below the engine. ``coalesce`` reads the upstream in a task of its own
and hands the consumer, each time it asks, all the items that arrived meanwhile, merged into one.
An idle stream still gets its first item at once (no timer); a busy one carries many per item.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any, TypeVar

T = TypeVar("T")

_END = object()


class _Failure:
    def __init__(self, exc: Exception):
        self.exc = exc


def concat_lists(items: list[list[Any]]) -> list[Any]:
    return items[0] if len(items) == 1 else [x for item in items for x in item]


def concat_bytes(items: list[bytes]) -> bytes:
    return items[0] if len(items) == 1 else b"".join(items)


async def coalesce(source: AsyncIterator[T], merge: Callable[[list[T]], T]) -> AsyncIterator[T]:
    """Yield ``merge`` of every item ``source`` produced since the last yield, in order.

    An exception of ``source`` is raised after the items before it. Closing this iterator early
    stops the read-ahead task and cancels ``source`` when it can be cancelled (a Ray Serve
    response generator), so the request upstream ends too.
    """
    queue: asyncio.Queue = asyncio.Queue()

    async def pump() -> None:
        try:
            async for item in source:
                queue.put_nowait(item)
        except Exception as exc:  # forwarded to the consumer, after what came before it
            queue.put_nowait(_Failure(exc))
        else:
            queue.put_nowait(_END)

    task = asyncio.ensure_future(pump())
    finished = False
    try:
        while not finished:
            ready = [await queue.get()]
            while not queue.empty():
                ready.append(queue.get_nowait())
            items = []
            failure = None
            for item in ready:
                if item is _END:
                    finished = True
                elif isinstance(item, _Failure):
                    finished, failure = True, item.exc
                else:
                    items.append(item)
            if items:
                yield merge(items)
            if failure is not None:
                raise failure
    finally:
        if not task.done():
            task.cancel()
            cancel = getattr(source, "cancel", None)
            if callable(cancel):
                cancel()


async def close(stream: Any) -> None:
    """End a stream early: ``aclose`` a generator (``coalesce`` then cancels its source), or
    ``cancel`` a Ray Serve response generator, so the request upstream stops at once."""
    aclose = getattr(stream, "aclose", None)
    if callable(aclose):
        await aclose()
    else:
        stream.cancel()
