"""Resumable streams as llama-server serves them (``tools/server/server-stream.cpp``): a streamed
completion sent with an ``X-Conversation-Id`` header keeps its SSE bytes in a session that outlives
the client's connection. ``GET /v1/stream?conv_id=ID&from=N`` replays them from byte ``N`` and
follows the live ones, ``POST /v1/streams/lookup`` tells the state of the ids a caller names,
``DELETE /v1/stream?conv_id=ID`` stops the generation and drops the session.

One conversation has at most one live session: a new stream on the same id replaces (and stops)
the old one. A session keeps its last 4 MiB (older bytes are dropped: a reader behind them gets
"Stream offset lost") and is forgotten 300 s after it ends. This module is the state alone, on
one asyncio loop (the Ray actor of deployments/serve/stream_store.py holds it)."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

TTL_S = 300  # the reference's STREAM_SESSION_TTL_SECONDS
MAX_BYTES = 4 * 1024 * 1024  # STREAM_SESSION_MAX_BYTES
CONVERSATION_HEADER = "x-conversation-id"


class OffsetLost(Exception):
    """The reader's offset is older than the bytes the session still holds."""


@dataclass
class StreamSession:
    conversation_id: str
    generation: int  # which stream of the conversation this is: a replaced one's writes fail
    cap: int = MAX_BYTES
    started_at: int = field(default_factory=lambda: int(time.time()))
    completed_at: int = 0
    buffer: bytearray = field(default_factory=bytearray)
    dropped: int = 0
    done: bool = False
    cancelled: bool = False
    changed: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def total(self) -> int:
        return self.dropped + len(self.buffer)

    def append(self, data: bytes) -> bool:
        if self.done:
            return False
        if len(data) >= self.cap:  # one chunk over the cap: only its tail fits
            self.dropped += len(self.buffer) + len(data) - self.cap
            self.buffer = bytearray(data[len(data) - self.cap:])
        else:
            overflow = len(self.buffer) + len(data) - self.cap
            if overflow > 0:
                del self.buffer[:overflow]
                self.dropped += overflow
            self.buffer += data
        self._wake()
        return True

    def finalize(self) -> None:
        if not self.done:
            self.done, self.completed_at = True, int(time.time())
            self._wake()

    def cancel(self) -> None:
        self.cancelled = True
        self.finalize()

    def read(self, offset: int) -> bytes:
        """The bytes from ``offset`` on that the session holds now."""
        if offset < self.dropped:
            raise OffsetLost
        return bytes(self.buffer[offset - self.dropped:])

    async def wait(self, offset: int, timeout: float) -> None:
        """Until there are bytes past ``offset``, the session ends, or ``timeout``."""
        if offset < self.total or self.done:
            return
        self.changed.clear()
        try:
            await asyncio.wait_for(self.changed.wait(), timeout)
        except asyncio.TimeoutError:
            pass

    def _wake(self) -> None:
        self.changed.set()

    def info(self) -> dict:
        return {"conversation_id": self.conversation_id, "is_done": self.done,
                "total_bytes": self.total, "started_at": self.started_at,
                "completed_at": self.completed_at}


class StreamSessions:
    """The live sessions by conversation id."""

    def __init__(self, cap: int = MAX_BYTES, ttl_s: int = TTL_S):
        self.cap, self.ttl_s = cap, ttl_s
        self.sessions: dict[str, StreamSession] = {}
        self._generations = 0

    def open(self, conversation_id: str) -> int:
        """A new session for the conversation, replacing (and stopping) its previous one;
        returns its generation, which the producer's writes name."""
        self._generations += 1
        previous = self.sessions.get(conversation_id)
        self.sessions[conversation_id] = StreamSession(conversation_id, self._generations,
                                                       self.cap)
        if previous is not None:
            previous.cancel()
        return self._generations

    def producing(self, conversation_id: str, generation: int) -> StreamSession | None:
        """The session a producer writes to, while it is still that conversation's and live."""
        session = self.sessions.get(conversation_id)
        if session is None or session.generation != generation or session.cancelled:
            return None
        return session

    def append(self, conversation_id: str, generation: int, data: bytes) -> bool:
        """False once the session was stopped or replaced: the producer stops."""
        session = self.producing(conversation_id, generation)
        return session is not None and session.append(data)

    def finish(self, conversation_id: str, generation: int, keep: bool = True) -> None:
        """The producer's end; ``keep=False`` (the request failed before streaming) forgets the
        session so nothing is left to find or replay."""
        session = self.producing(conversation_id, generation)
        if session is None:
            return
        session.finalize()
        if not keep:
            del self.sessions[conversation_id]

    def get(self, conversation_id: str) -> StreamSession | None:
        return self.sessions.get(conversation_id)

    def lookup(self, requested: list[str]) -> list[dict]:
        """Each requested id's session, and those of ``<id>::<model>`` (per model variant)."""
        out = []
        for rid in requested:
            out += [s.info() for s in self.sessions.values()
                    if s.conversation_id == rid or s.conversation_id.startswith(rid + "::")]
        return out

    def stop(self, conversation_id: str) -> None:
        """DELETE: the producer stops, readers end, the session is forgotten (idempotent)."""
        session = self.sessions.pop(conversation_id, None)
        if session is not None:
            session.cancel()

    def collect(self, now: float | None = None) -> int:
        """Forget the sessions that ended more than the TTL ago; how many."""
        cutoff = (time.time() if now is None else now) - self.ttl_s
        old = [k for k, s in self.sessions.items() if s.completed_at and s.completed_at <= cutoff]
        for key in old:
            del self.sessions[key]
        return len(old)


def parse_lookup(body: object) -> list[str]:
    """The reference's reading of ``{"conversation_ids": [...]}``: non-empty strings only, any
    other value ignored."""
    ids = body.get("conversation_ids") if isinstance(body, dict) else None
    if not isinstance(ids, list):
        return []
    return [v for v in ids if isinstance(v, str) and v]


def parse_offset(raw: str | None) -> int | None:
    """``from`` as std::stoull reads it: leading digits (after blanks and an optional sign),
    None when there are none."""
    text = (raw or "").lstrip()
    sign = text[:1] in "+-" and text[:1] != ""
    digits = ""
    for ch in text[1:] if sign else text:
        if not ch.isdigit():
            break
        digits += ch
    if not digits:
        return None
    value = int(digits)
    if value >= 1 << 64:  # out of range: stoull throws
        return None
    if text.startswith("-"):  # stoull wraps a negative value around
        value = (-value) % (1 << 64)
    return value
