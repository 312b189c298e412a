"""Shared channels: one connection between two replica processes carries the stream items of
every request they have in common.

A Ray Serve streaming call costs a few hundred microseconds of CPU per item on each side, so with
one stream per request the graph's cost grows with streams × items. With a channel, each request
is still one Ray Serve call per hop, routed by the handle as before (``max_ongoing_requests``,
back-pressure, the autoscaler's metric, the prefix router and multiplexing see it for its whole
life, and cancelling it stops the work upstream), but the call returns only how many items it
sent; the items travel on the channel. The receiving process (a shaper for the replica's events,
an ingress for the shaper's SSE chunks) listens; the sending one connects on its first request
to it and sends everything that is ready in one loop iteration as one frame, whichever requests
it belongs to.

A frame is an 8-byte length and ``[(request id, item), ...]`` in msgpack (engine/wire.py: plain
data and the engine's event dataclasses, so decoding a frame cannot run code, whoever sent it; a
frame that is not one closes its connection). A connection opens with the listener's secret,
which the request's Ray call carries to the sender; the connection itself is plain TCP, so with
Ray's TLS on the items stay on Ray Serve's streams (``shared``).
"""

from __future__ import annotations

import asyncio
import functools
import hmac
import itertools
import logging
import os
import secrets
import struct
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from deployments.api.errors import Refusal
from engine import types as engine_types
from engine.wire import Codec, WireError

log = logging.getLogger("mlxray.channel")

HEADER = struct.Struct("!Q")
TOKEN_BYTES = 16
SEND_BUFFER_BYTES = 4 << 20  # past this much unsent data, a sender waits for the socket
LATE_ITEMS_S = 30.0  # after a call returned, its items are on the wire: this is a lost channel
CONNECT_S = 5.0  # to open a connection, or to present its secret
# what the graph's channels carry: the replica's event batches, the shaper's SSE bytes or Refusal
ITEMS = Codec((engine_types.StartEvent, engine_types.ProgressEvent, engine_types.TokenEvent,
               engine_types.FinalEvent, engine_types.ErrorEvent, engine_types.Timings,
               engine_types.TokenProb, engine_types.TokenProbs, Refusal))


class ChannelLost(ConnectionError):
    """The connection that carried a request's items broke before they all arrived."""


class FailedAfter(Exception):
    """The sender failed after sending ``sent`` items: the receiver raises ``error`` once
    those have arrived, so the failure does not overtake them."""

    def __init__(self, sent: int, error: BaseException):
        super().__init__(sent, error)
        self.sent, self.error = sent, error


@dataclass(frozen=True)
class ReplyTo:
    """Where the items of one request go: a listener and the request's id there."""

    host: str
    port: int
    token: bytes = field(repr=False)
    request_id: int


def shared(stream_channel: str) -> bool:
    """Whether stream items take the shared channels: asked for, and Ray not running with TLS
    (the channels are plain TCP)."""
    tls = os.environ.get("RAY_USE_TLS", "0").lower() in ("1", "true")
    return stream_channel == "shared" and not tls


# ---- the receiving side --------------------------------------------------------------------
class _CallDone:
    def __init__(self, task: asyncio.Future):
        self.task = task


_LOST = object()


class Listener:
    """The receiving end in one process: a TCP server and an inbox per request in flight."""

    def __init__(self, host: str | None = None, codec: Codec = ITEMS) -> None:
        self._codec = codec
        self._inboxes: dict[int, asyncio.Queue] = {}
        self._connection_of: dict[int, int] = {}  # request id -> the connection it arrived on
        self._ids = itertools.count(1)
        self._connections = itertools.count(1)
        self._token = secrets.token_bytes(TOKEN_BYTES)
        self._server: asyncio.AbstractServer | None = None
        self._starting: asyncio.Lock | None = None
        self.host = host or ""
        self.port = 0
        self.connections = self.frames = self.items = 0  # since start, for state()

    async def start(self) -> None:
        if self._server is not None:
            return
        if self._starting is None:
            self._starting = asyncio.Lock()
        async with self._starting:
            if self._server is None:
                self.host = self.host or _node_ip()
                self._server = await asyncio.start_server(self._serve, self.host, 0)
                self.port = self._server.sockets[0].getsockname()[1]

    def state(self) -> dict:
        """Its process, where it listens, and what it has received: connections, frames, items."""
        return {"pid": os.getpid(), "host": self.host, "port": self.port,
                "connections": self.connections,
                "frames": self.frames, "items": self.items, "in_flight": len(self._inboxes)}

    def open(self) -> tuple[ReplyTo, asyncio.Queue]:
        request_id = next(self._ids)
        inbox: asyncio.Queue = asyncio.Queue()
        self._inboxes[request_id] = inbox
        return ReplyTo(self.host, self.port, self._token, request_id), inbox

    def close(self, request_id: int) -> None:
        self._inboxes.pop(request_id, None)
        self._connection_of.pop(request_id, None)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connection = next(self._connections)
        try:
            token = await asyncio.wait_for(reader.readexactly(TOKEN_BYTES), CONNECT_S)
            if not hmac.compare_digest(token, self._token):
                log.warning("a channel connection with a wrong token was refused")
                return
            self.connections += 1
            while True:
                (size,) = HEADER.unpack(await reader.readexactly(HEADER.size))
                self._deliver(self._codec.loads(await reader.readexactly(size)), connection)
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.TimeoutError):
            pass  # the sender went away: its requests in flight hear it below
        except WireError as exc:  # not a frame of ours: the connection is dropped, unread
            log.warning("a channel connection sent a frame that is not one and was closed: %s",
                        exc)
        except asyncio.CancelledError:  # the loop is closing; on 3.11 asyncio's stream
            pass  # callback would log a cancelled connection task as an error
        finally:
            writer.close()
            for request_id, on in list(self._connection_of.items()):
                if on == connection and request_id in self._inboxes:
                    self._inboxes[request_id].put_nowait(_LOST)

    def _deliver(self, frame: Any, connection: int) -> None:
        if not (isinstance(frame, list) and all(isinstance(e, tuple) and len(e) == 2
                                                and type(e[0]) is int for e in frame)):
            raise WireError("a frame is a list of (request id, item)")
        self.frames += 1
        self.items += len(frame)
        for request_id, item in frame:
            inbox = self._inboxes.get(request_id)
            if inbox is not None:  # else the request ended here (cancelled) before its items
                self._connection_of[request_id] = connection
                inbox.put_nowait(item)


class _Tally:
    """One request's account: items received, items its call says were sent, its failure."""

    def __init__(self) -> None:
        self.received = 0
        self.expected: int | None = None
        self.failure: BaseException | None = None  # raised at once
        self.failure_after: BaseException | None = None  # raised once ``expected`` arrived

    @property
    def complete(self) -> bool:
        return self.expected is not None and self.received >= self.expected

    def take(self, ready: list[Any]) -> list[Any]:
        """The items among ``ready``; the call's outcome and a lost channel are noted."""
        items = []
        for entry in ready:
            if isinstance(entry, _CallDone):
                self._call_done(entry.task)
            elif entry is _LOST:
                self.failure = ChannelLost("the channel from the sending replica broke")
            else:
                items.append(entry)
        self.received += len(items)
        return items

    def _call_done(self, task: asyncio.Future) -> None:
        if task.cancelled():
            self.failure = asyncio.CancelledError()
            return
        error = task.exception()
        if error is None:
            self.expected = task.result()
            return
        after = getattr(error, "cause", None) or error  # Ray wraps the sender's exception
        if isinstance(after, FailedAfter):
            self.expected, self.failure_after = after.sent, after.error
        else:
            self.failure = error

    def check(self) -> None:
        if self.failure is not None:
            raise self.failure
        if self.complete and self.failure_after is not None:
            raise self.failure_after


async def receive(listener: Listener, call: Callable[[ReplyTo], Any],
                  merge: Callable[[list[Any]], Any]) -> AsyncIterator[Any]:
    """Make the request's call (``call(reply_to)`` returns a Ray Serve response that resolves to
    the number of items sent) and yield its items, each time ``merge`` of all that arrived.

    A failure of the call (the replica died, the request was refused by Serve) is raised after
    the items the sender had sent. Closing this iterator early cancels the call, so the work
    upstream stops.
    """
    await listener.start()
    reply, inbox = listener.open()
    response = result = None
    tally = _Tally()
    try:
        response = call(reply)
        result = asyncio.ensure_future(response)
        result.add_done_callback(lambda task: inbox.put_nowait(_CallDone(task)))
        while not tally.complete:
            items = tally.take(await _ready(inbox, late=tally.expected is not None))
            if items:
                yield merge(items)
            tally.check()
        tally.check()
    finally:
        listener.close(reply.request_id)
        if result is not None and not result.done():
            response.cancel()
            result.cancel()
        elif result is not None and not result.cancelled():
            result.exception()  # seen, whatever ended the stream first


async def _ready(inbox: asyncio.Queue, late: bool) -> list[Any]:
    """Everything in ``inbox`` once it has something; ``late``: the call has returned, so its
    items are on the wire, and one that never comes means the channel was lost."""
    try:
        ready = [await asyncio.wait_for(inbox.get(), LATE_ITEMS_S if late else None)]
    except asyncio.TimeoutError:
        raise ChannelLost("items the sender sent never arrived") from None
    while not inbox.empty():
        ready.append(inbox.get_nowait())
    return ready


# ---- the sending side ----------------------------------------------------------------------
class _Link:
    """One connection to a listener; what is sent in one loop iteration leaves as one frame."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                 codec: Codec):
        self.codec = codec
        self.writer = writer
        self.pending: list[tuple[int, Any]] = []
        self.broken = False
        self.unsendable: dict[int, Exception] = {}  # request id -> why an item could not go
        self._watch = asyncio.ensure_future(self._watch_close(reader))

    async def _watch_close(self, reader: asyncio.StreamReader) -> None:
        try:
            await reader.read()  # the listener never writes: this returns when it closes
        finally:
            self.broken = True
            self.writer.close()

    def send(self, request_id: int, item: Any) -> None:
        self.check(request_id)
        if not self.pending:
            asyncio.get_running_loop().call_soon(self.flush)
        self.pending.append((request_id, item))

    def check(self, request_id: int) -> None:
        """Raise what keeps this request's items from their listener."""
        if self.broken or self.writer.is_closing():
            self.broken = True
            raise ChannelLost("the channel to the receiving replica is closed")
        if request_id in self.unsendable:  # a bug: the request fails without waiting for its
            raise FailedAfter(0, self.unsendable.pop(request_id))  # dropped items

    def flush(self) -> None:
        frame, self.pending = self.pending, []
        if self.broken or not frame:
            return
        try:
            data = self.codec.dumps(frame)
        except WireError:  # one request's item: the others still go
            data = self.codec.dumps([e for e in frame if self._packable(e)])
        self.writer.write(HEADER.pack(len(data)) + data)

    def _packable(self, entry: tuple[int, Any]) -> bool:
        try:
            self.codec.dumps(entry)
        except WireError as exc:  # kept for the request's sender to raise
            log.exception("a stream item could not be packed")
            self.unsendable[entry[0]] = exc
            return False
        return True

    async def drain(self) -> None:
        if self.writer.transport.get_write_buffer_size() > SEND_BUFFER_BYTES:
            await self.writer.drain()


class Sender:
    """The sending end in one process: a link per listener, opened on first use."""

    def __init__(self, codec: Codec = ITEMS) -> None:
        self._codec = codec
        self._links: dict[tuple[str, int, bytes], asyncio.Future] = {}

    async def link(self, reply: ReplyTo) -> _Link:
        key = (reply.host, reply.port, reply.token)
        opening = self._links.get(key)
        if opening is None or _failed(opening):
            # links to listeners gone (a replaced replica's) are dropped as a new one opens
            self._links = {k: f for k, f in self._links.items() if not _failed(f)}
            opening = self._links[key] = asyncio.ensure_future(_connect(reply, self._codec))
        return await asyncio.shield(opening)


def _failed(opening: asyncio.Future) -> bool:
    return opening.done() and (opening.cancelled() or opening.exception() is not None
                               or opening.result().broken)


async def _connect(reply: ReplyTo, codec: Codec) -> _Link:
    try:
        reader, writer = await asyncio.wait_for(
            asyncio.open_connection(reply.host, reply.port), CONNECT_S)
    except (OSError, asyncio.TimeoutError) as exc:
        raise ChannelLost(
            f"cannot reach the stream-channel listener at {reply.host}:{reply.port} ({exc!r}); "
            "nodes that only open Ray's own ports to each other need stream_channel: "
            "per_request") from None
    writer.write(reply.token)
    return _Link(reader, writer, codec)


async def pump(items: AsyncIterator[Any], sender: Sender, reply: ReplyTo) -> int:
    """Send every item of ``items`` to ``reply`` on one link; the number sent, once all are
    written. An error of ``items`` is raised as ``FailedAfter`` (the receiver raises it after
    the items before it); cancelled (the caller went away) or unable to send, it closes
    ``items`` at once, so the work behind them stops."""
    sent = 0
    link: _Link | None = None
    try:
        link = await sender.link(reply)
        async for item in items:
            link.send(reply.request_id, item)
            sent += 1
            await link.drain()
        link.flush()  # now: the count returned must not overtake the items
        link.check(reply.request_id)
        return sent
    except (ChannelLost, FailedAfter):
        raise
    except Exception as exc:
        if link is not None:
            link.flush()
        raise FailedAfter(sent, exc) from exc
    finally:
        aclose = getattr(items, "aclose", None)
        if callable(aclose):
            await aclose()


def _node_ip() -> str:
    import ray

    return ray.util.get_node_ip_address()


@functools.cache
def listener() -> Listener:
    """This process's listener (a replica process receives on one port, whatever it serves)."""
    return Listener()


@functools.cache
def sender() -> Sender:
    return Sender()
