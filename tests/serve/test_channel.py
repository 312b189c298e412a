"""deployments/serve/channel.py: the items of many requests on one connection between two processes,
each request still its own call. Here a listener and senders in one event loop (calls stood in
for by tasks), then the model replica's ``push`` sending to a listener in this process, then the
default graph's shaper and ingress receiving over it."""

from __future__ import annotations

import asyncio
import socket

import pytest

from deployments.serve import channel
from deployments.serve.streams import concat_lists


class Call:
    """A Ray Serve response's stand-in: awaiting it gives the call's result; cancellable."""

    def __init__(self, coro):
        self.task = asyncio.ensure_future(coro)
        self.cancelled = False

    def __await__(self):
        return self.task.__await__()

    def cancel(self) -> None:
        self.cancelled = True
        self.task.cancel()


async def numbers(n: int, tag: int, fail: Exception | None = None, ended: list | None = None):
    try:
        for i in range(n):
            yield [(tag, i)]
            await asyncio.sleep(0)
        if fail is not None:
            raise fail
    finally:
        if ended is not None:
            ended.append(tag)


async def collect(stream) -> list:
    return [x async for batch in stream for x in batch]


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 30))


def test_the_items_of_many_requests_share_one_connection_in_order():
    async def scenario():
        listener, sender = channel.Listener("127.0.0.1"), channel.Sender()

        def request(tag: int):
            return channel.receive(
                listener, lambda reply: Call(channel.pump(numbers(50, tag), sender, reply)),
                concat_lists)

        results = await asyncio.gather(*(collect(request(tag)) for tag in range(8)))
        return results, listener.state()

    results, state = run(scenario())
    for tag, items in enumerate(results):
        assert items == [(tag, i) for i in range(50)]
    assert state["connections"] == 1
    assert state["items"] == 8 * 50
    assert state["frames"] < state["items"]  # requests ready in the same loop turn share a frame
    assert state["in_flight"] == 0


def test_a_failed_call_is_raised_after_the_items_before_it():
    async def scenario():
        listener, sender = channel.Listener("127.0.0.1"), channel.Sender()
        got = []
        stream = channel.receive(
            listener,
            lambda reply: Call(channel.pump(numbers(3, 0, ValueError("boom")), sender, reply)),
            concat_lists)
        with pytest.raises(ValueError, match="boom"):
            async for batch in stream:
                got += batch
        return got

    assert run(scenario()) == [(0, 0), (0, 1), (0, 2)]


def test_closing_the_stream_early_cancels_the_call_and_closes_the_source():
    async def scenario():
        listener, sender = channel.Listener("127.0.0.1"), channel.Sender()
        ended: list = []
        calls: list[Call] = []

        def call(reply):
            calls.append(Call(channel.pump(numbers(10**9, 7, ended=ended), sender, reply)))
            return calls[0]

        stream = channel.receive(listener, call, concat_lists)
        assert (await anext(stream))[0] == (7, 0)
        await stream.aclose()
        for _ in range(100):
            if ended:
                break
            await asyncio.sleep(0.01)
        return calls[0].cancelled, ended, listener.state()["in_flight"]

    cancelled, ended, in_flight = run(scenario())
    assert cancelled and ended == [7] and in_flight == 0


def test_a_connection_without_the_secret_delivers_nothing():
    async def scenario():
        listener = channel.Listener("127.0.0.1")
        await listener.start()
        reply, inbox = listener.open()
        stranger = channel.ReplyTo(reply.host, reply.port, b"x" * channel.TOKEN_BYTES,
                                   reply.request_id)
        reader, writer = await asyncio.open_connection(reply.host, reply.port)
        writer.write(stranger.token)
        data = channel.ITEMS.dumps([(reply.request_id, ["forged"])])
        writer.write(channel.HEADER.pack(len(data)) + data)
        closed = await asyncio.wait_for(reader.read(), 5)  # the listener hangs up
        writer.close()
        return closed, inbox.empty(), listener.state()["connections"]

    assert run(scenario()) == (b"", True, 0)


class Planted:
    """What a pickle frame would run on decode: unpickling it calls ``Planted.run``."""

    ran: list = []

    @staticmethod
    def run(*args) -> list:
        Planted.ran.append(args)
        return ["planted"]

    def __reduce__(self):
        return Planted.run, ("executed",)


def test_a_frame_that_is_a_pickle_is_refused_unexecuted():
    """With the right secret, a frame that is a pickle (whose decoding would call a function)
    runs nothing and delivers nothing: the connection is closed, the requests on it fail as a
    lost channel, and the listener serves the next connection."""
    import pickle

    async def scenario():
        listener, sender = channel.Listener("127.0.0.1"), channel.Sender()
        await listener.start()
        reply, inbox = listener.open()
        reader, writer = await asyncio.open_connection(reply.host, reply.port)
        writer.write(reply.token)
        for payload in ([(reply.request_id, [1])], [(reply.request_id, Planted())]):
            data = pickle.dumps(payload)
            writer.write(channel.HEADER.pack(len(data)) + data)
        closed = await asyncio.wait_for(reader.read(), 5)
        writer.close()
        listener.close(reply.request_id)
        after = channel.receive(
            listener, lambda reply: Call(channel.pump(numbers(3, 2), sender, reply)),
            concat_lists)
        return closed, inbox.empty(), await collect(after)

    Planted.ran.clear()
    closed, nothing_delivered, after = run(scenario())
    assert Planted.ran == [] and closed == b"" and nothing_delivered
    assert after == [(2, 0), (2, 1), (2, 2)]


def test_a_broken_connection_fails_its_requests_and_the_sender_reconnects():
    """The sending process dies mid-request: the request ends with ChannelLost (an envelope,
    deployments/serve/failures.py), not a hang; the next request opens a new connection."""
    async def scenario():
        listener, sender = channel.Listener("127.0.0.1"), channel.Sender()
        hold = asyncio.Event()

        async def one_then_hang(reply):
            (await sender.link(reply)).send(reply.request_id, [(0, 0)])
            await hold.wait()

        stream = channel.receive(listener, lambda reply: Call(one_then_hang(reply)), concat_lists)
        assert await anext(stream) == [(0, 0)]
        (link,) = [await f for f in sender._links.values()]
        link.writer.transport.abort()
        with pytest.raises(channel.ChannelLost):
            await anext(stream)
        again = channel.receive(
            listener, lambda reply: Call(channel.pump(numbers(2, 1), sender, reply)),
            concat_lists)
        return await collect(again), listener.state()["connections"]

    items, connections = run(scenario())
    assert items == [(1, 0), (1, 1)] and connections == 2


def test_a_sender_whose_listener_went_away_stops_its_source():
    """The receiving process died: the sender's next item raises ChannelLost and the source is
    closed (in a replica: the engine cancels the request) without waiting for a caller."""
    async def scenario():
        listener, sender = channel.Listener("127.0.0.1"), channel.Sender()
        ended: list = []
        pumps: list = []

        def call(reply):
            pumps.append(Call(channel.pump(numbers(10**9, 3, ended=ended), sender, reply)))
            return pumps[0]

        stream = channel.receive(listener, call, concat_lists)
        await anext(stream)
        (link,) = [await f for f in sender._links.values()]
        link.writer.transport.abort()  # as if the listener's process had died
        with pytest.raises(channel.ChannelLost):
            await asyncio.wait_for(pumps[0].task, 5)
        return ended

    assert run(scenario()) == [3]


def test_an_item_that_cannot_travel_fails_its_request_alone():
    async def scenario():
        listener, sender = channel.Listener("127.0.0.1"), channel.Sender()

        async def with_a_lambda():
            yield [(0, 0)]
            await asyncio.sleep(0)
            yield [lambda: None]

        bad = channel.receive(
            listener, lambda reply: Call(channel.pump(with_a_lambda(), sender, reply)),
            concat_lists)
        good = channel.receive(
            listener, lambda reply: Call(channel.pump(numbers(20, 1), sender, reply)),
            concat_lists)
        return await asyncio.gather(collect(bad), collect(good), return_exceptions=True)

    bad, good = run(scenario())
    assert isinstance(bad, Exception) and "not plain data" in repr(bad)
    assert good == [(1, i) for i in range(20)]


def test_a_listener_out_of_reach_is_a_lost_channel_that_names_the_fix():
    async def scenario():
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]  # nothing listens there once closed
        reply = channel.ReplyTo("127.0.0.1", port, b"x" * channel.TOKEN_BYTES, 1)
        with pytest.raises(channel.ChannelLost, match="stream_channel: per_request"):
            await channel.pump(numbers(3, 0), channel.Sender(), reply)

    run(scenario())


def test_a_connection_that_never_presents_the_secret_is_closed(monkeypatch):
    monkeypatch.setattr(channel, "CONNECT_S", 0.2)

    async def scenario():
        listener = channel.Listener("127.0.0.1")
        await listener.start()
        reader, writer = await asyncio.open_connection(listener.host, listener.port)
        closed = await asyncio.wait_for(reader.read(), 5)
        writer.close()
        return closed

    assert run(scenario()) == b""


def test_shared_channels_give_way_to_ray_tls(monkeypatch):
    assert channel.shared("shared") and not channel.shared("per_request")
    monkeypatch.setenv("RAY_USE_TLS", "1")
    assert not channel.shared("shared")


def test_items_that_never_arrive_end_the_request(monkeypatch):
    monkeypatch.setattr(channel, "LATE_ITEMS_S", 0.2)

    async def claims_three(reply):
        return 3

    async def scenario():
        listener = channel.Listener("127.0.0.1")
        stream = channel.receive(listener, lambda reply: Call(claims_three(reply)), concat_lists)
        with pytest.raises(channel.ChannelLost, match="never arrived"):
            await anext(stream)

    run(scenario())


def test_the_replica_pushes_many_requests_over_one_connection(base_url):
    """The model replica's ``push``, called as the shaper calls it, from a listener here: 12
    concurrent requests get generate's own batches, over one connection."""
    from ray import serve

    from deployments.api.config import GraphArgs
    from deployments.api.engine_requests import to_requests
    from deployments.serve.endpoint import ModelEndpoint
    from deployments.serve.routes.native import prepare
    from engine.types import FinalEvent, TokenEvent
    from engine.vocab import load_vocab

    from .. import conftest

    args = GraphArgs(model=conftest.MODEL)
    endpoint = ModelEndpoint(None, None, args, load_vocab(args.model_path))
    params, _ = prepare(endpoint, {"prompt": "x", "n_predict": 6, "temperature": 0,
                                   "ignore_eos": True, "stream": True})
    replica = args.handle(serve.get_deployment_handle("ModelReplica", app_name="conformance"))
    streamed = args.handle(serve.get_deployment_handle(
        "ModelReplica", app_name="conformance")).options(stream=True)

    async def tokens(stream) -> list[int]:
        events = [ev async for batch in stream for ev in batch]
        assert isinstance(events[-1], FinalEvent)
        return [ev.token for ev in events if isinstance(ev, TokenEvent)]

    async def scenario():
        listener = channel.Listener("127.0.0.1")
        prompts = [[[5 + i, 6, 7]] for i in range(12)]
        pushed = await asyncio.gather(*(tokens(channel.receive(
            listener, lambda reply, p=p: replica.push.remote(to_requests(params, p), reply),
            concat_lists))
            for p in prompts))
        direct = await asyncio.gather(*(tokens(streamed.generate.remote(to_requests(params, p)))
                                        for p in prompts))
        return pushed, direct, listener.state()

    pushed, direct, state = run(scenario())
    assert pushed == direct and all(len(t) == 6 for t in pushed)
    assert state["connections"] == 1 and state["in_flight"] == 0


def test_the_default_graph_streams_its_items_on_shared_channels(base_url, client):
    """A streamed request through the default graph: the shaper received the replica's events
    and the ingress the shaper's chunks on their listeners."""
    from ray import serve

    shaper = serve.get_deployment_handle("ResponseShaper", app_name="conformance")
    ingress = serve.get_deployment_handle("Ingress", app_name="conformance")
    before = [h.channel_state.remote().result(timeout_s=30) for h in (shaper, ingress)]
    r = client.post("/completion", json={"prompt": "def f(x):", "n_predict": 8, "stream": True,
                                         "temperature": 0})
    assert r.status_code == 200 and r.text.count("data: ") >= 8
    after = [h.channel_state.remote().result(timeout_s=30) for h in (shaper, ingress)]
    for was, now in zip(before, after):
        assert now["items"] > was["items"] and now["connections"] >= 1
        assert now["in_flight"] == 0
