"""The resumable streams' sessions (deployments/api/stream_sessions.py) against the reference's
rules in server-stream.cpp: the byte cap and the dropped prefix, replacement, the producer's
generation, the TTL, lookup by id and ``<id>::<model>``, and ``from`` as std::stoull reads it."""

from __future__ import annotations

import asyncio

import pytest

from deployments.api.stream_sessions import (
    OffsetLost,
    StreamSession,
    StreamSessions,
    parse_lookup,
    parse_offset,
)


def test_the_cap_drops_the_oldest_bytes():
    s = StreamSession("c", 1, cap=8)
    assert s.append(b"abcdef") and s.append(b"ghij")
    assert (s.dropped, bytes(s.buffer), s.total) == (2, b"cdefghij", 10)
    assert s.read(4) == b"efghij"
    with pytest.raises(OffsetLost):
        s.read(1)
    s.append(b"0123456789xy")  # one chunk over the cap: only its tail
    assert (bytes(s.buffer), s.dropped, s.total) == (b"456789xy", 14, 22)
    s.finalize()
    assert not s.append(b"late") and s.completed_at >= s.started_at


def test_a_new_stream_replaces_and_stops_the_old_one():
    sessions = StreamSessions()
    first = sessions.open("c")
    assert sessions.append("c", first, b"one")
    old = sessions.get("c")
    second = sessions.open("c")
    assert old.cancelled and old.done
    assert not sessions.append("c", first, b"stale")  # the old producer stops
    assert sessions.append("c", second, b"two") and sessions.get("c").read(0) == b"two"
    sessions.finish("c", first)  # the old producer's end leaves the new session alone
    assert not sessions.get("c").done


def test_a_failed_request_leaves_nothing():
    sessions = StreamSessions()
    gen = sessions.open("c")
    sessions.finish("c", gen, keep=False)
    assert sessions.get("c") is None and sessions.lookup(["c"]) == []


def test_lookup_matches_the_id_and_its_model_variants():
    sessions = StreamSessions()
    for conv in ("a", "a::m1", "ab", "b"):
        sessions.open(conv)
    assert [i["conversation_id"] for i in sessions.lookup(["a"])] == ["a", "a::m1"]
    assert sessions.lookup([]) == []


def test_stop_and_the_ttl():
    sessions = StreamSessions(ttl_s=300)
    gen = sessions.open("done")
    sessions.finish("done", gen)
    sessions.open("live")
    sessions.stop("live")
    assert sessions.get("live") is None
    sessions.stop("live")  # idempotent
    ended = sessions.get("done").completed_at
    assert sessions.collect(now=ended + 299) == 0
    assert sessions.collect(now=ended + 300) == 1 and sessions.get("done") is None


def test_a_reader_wakes_on_new_bytes():
    async def scenario() -> bytes:
        s = StreamSession("c", 1)
        waiting = asyncio.ensure_future(s.wait(0, timeout=5))
        await asyncio.sleep(0.01)
        s.append(b"x")
        await asyncio.wait_for(waiting, 1)
        return s.read(0)

    assert asyncio.run(scenario()) == b"x"


@pytest.mark.parametrize("raw, offset", [
    ("12", 12), ("  7", 7), ("+3", 3), ("5abc", 5), ("0", 0),
    ("abc", None), ("", None), ("-", None), ("-1", (1 << 64) - 1), (str(1 << 64), None),
])
def test_from_is_read_as_stoull_reads_it(raw, offset):
    assert parse_offset(raw) == offset


def test_lookup_body():
    assert parse_lookup({"conversation_ids": ["a", "", 3, None, "b"]}) == ["a", "b"]
    assert parse_lookup({"conversation_ids": "a"}) == [] and parse_lookup([1]) == []
