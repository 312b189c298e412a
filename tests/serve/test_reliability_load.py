"""Disconnects and load through the real graph, on a dedicated 4-slot graph: clients that go away
leave nothing behind in the engine; 64 concurrent streaming clients are all served, and the
replica's resident memory stays flat past warm-up.

MLXRAY_LOAD_SECONDS (default 8) and MLXRAY_LOAD_CLIENTS (default 64) size the load test; the
figures in docs/reliability.md were measured with MLXRAY_LOAD_SECONDS=60."""

from __future__ import annotations

import asyncio
import os
import time

import httpx
import psutil
import pytest

from ..reliability import (
    ENDLESS,
    Frames,
    dedicated_app,
    engine_state,
    engine_state_async,
    is_idle,
)

APP = "rel-load"
PROMPTS = ["def main():\n", "import os\n", "class Foo:\n    def __init__(self",
           "    for i in range(", "x = 1\n", "def f(a, b):\n", "# comment\n", "for k in d:\n"]
N_DISCONNECTS = 100
WAVE = 10
LOAD_SECONDS = float(os.environ.get("MLXRAY_LOAD_SECONDS", "8"))
LOAD_CLIENTS = int(os.environ.get("MLXRAY_LOAD_CLIENTS", "64"))
RSS_BOUND_MIB = 64


@pytest.fixture(scope="module")
def load_app(serve_instance: int):
    with dedicated_app(serve_instance, APP, {"n_parallel": 4, "n_ctx": 2048}) as base:
        yield base


@pytest.mark.heavy
def test_100_disconnects_leave_nothing_in_the_engine(load_app):
    """Waves of 10 streams on 4 slots: most close after their first frame, every fifth gives up
    while still waiting for it (queued). Within 1 s of the last close every slot is idle, no
    sequence is left in the batch, and every request the engine saw was cancelled, none ran on."""
    before = engine_state(APP)

    async def stream_then_leave(client: httpx.AsyncClient, i: int) -> bool:
        body = {**ENDLESS, "prompt": PROMPTS[i % len(PROMPTS)]}
        async with client.stream("POST", "/completion", json=body) as r:
            assert r.status_code == 200
            await Frames(r).next()
        return True  # leaving the block closes the connection mid-generation

    async def give_up_early(client: httpx.AsyncClient, i: int) -> bool:
        try:
            return await asyncio.wait_for(stream_then_leave(client, i), 0.3)
        except asyncio.TimeoutError:
            return False

    async def scenario() -> tuple[int, float, dict]:
        saw_frame = 0
        async with httpx.AsyncClient(base_url=load_app, timeout=60) as client:
            for wave in range(N_DISCONNECTS // WAVE):
                ids = range(wave * WAVE, (wave + 1) * WAVE)
                results = await asyncio.gather(*[
                    (give_up_early if i % 5 == 4 else stream_then_leave)(client, i) for i in ids
                ])
                saw_frame += sum(results)
        closed_at = time.monotonic()
        while True:
            state = await engine_state_async(APP)
            if is_idle(state) or time.monotonic() - closed_at > 1.0:
                return saw_frame, time.monotonic() - closed_at, state
            await asyncio.sleep(0.01)

    saw_frame, settle_s, after = asyncio.run(scenario())
    assert is_idle(after), after
    assert settle_s <= 1.0
    submitted = after["n_submitted"] - before["n_submitted"]
    cancelled = after["n_cancelled"] - before["n_cancelled"]
    assert saw_frame >= N_DISCONNECTS * 4 // 5
    assert saw_frame <= submitted <= N_DISCONNECTS
    assert cancelled == submitted  # none of them ran on to its 1500 tokens
    r = httpx.post(load_app + "/completion", json={"prompt": "x", "n_predict": 4}, timeout=60)
    assert r.status_code == 200
    print(f"\n{N_DISCONNECTS} disconnects ({saw_frame} mid-stream): engine idle after "
          f"{settle_s * 1e3:.0f} ms, {cancelled} cancelled of {submitted} submitted")


@pytest.mark.heavy
def test_64_streaming_clients_are_all_served_with_flat_memory(load_app):
    process = psutil.Process(engine_state(APP)["pid"])
    warmup_s = LOAD_SECONDS * 0.3

    async def client_loop(client: httpx.AsyncClient, i: int, stop_at: float,
                          outcome: dict) -> None:
        n = 0
        while time.monotonic() < stop_at:
            body = {"prompt": PROMPTS[(i + n) % len(PROMPTS)], "n_predict": 16, "stream": True,
                    "seed": i * 1000 + n}
            n += 1
            async with client.stream("POST", "/completion", json=body) as r:
                if r.status_code != 200:
                    outcome["errors"].append(f"{r.status_code}: {(await r.aread())[:200]!r}")
                    continue
                frames = await Frames(r).rest()
            final = frames[-1] if frames else {}
            if "error" in final or final.get("stop") is not True:
                outcome["errors"].append(f"bad final frame: {str(final)[:200]}")
                continue
            outcome["completed"] += 1
            outcome["tokens"] += final["tokens_predicted"]

    async def sample_rss(stop_at: float, samples: list[tuple[float, int]]) -> None:
        start = time.monotonic()
        while time.monotonic() < stop_at:
            samples.append((time.monotonic() - start, process.memory_info().rss))
            await asyncio.sleep(0.25)

    async def scenario() -> tuple[dict, list[tuple[float, int]]]:
        outcome: dict = {"errors": [], "completed": 0, "tokens": 0}
        samples: list[tuple[float, int]] = []
        limits = httpx.Limits(max_connections=LOAD_CLIENTS + 8)
        async with httpx.AsyncClient(base_url=load_app, timeout=120, limits=limits) as client:
            stop_at = time.monotonic() + LOAD_SECONDS
            await asyncio.gather(sample_rss(stop_at, samples), *[
                client_loop(client, i, stop_at, outcome) for i in range(LOAD_CLIENTS)
            ])
        return outcome, samples

    started = time.monotonic()
    outcome, samples = asyncio.run(scenario())
    elapsed = time.monotonic() - started
    assert outcome["errors"] == []
    assert outcome["completed"] >= LOAD_CLIENTS
    baseline = max(rss for t, rss in samples if t <= warmup_s)
    peak = max(rss for t, rss in samples)
    growth_mib = (peak - baseline) / 2**20
    assert growth_mib <= RSS_BOUND_MIB
    assert is_idle(engine_state(APP))
    print(f"\n{LOAD_CLIENTS} streaming clients for {elapsed:.0f} s: {outcome['completed']} "
          f"completions, {outcome['tokens']} tokens, 0 errors; replica RSS "
          f"{baseline / 2**20:.0f} MiB after warm-up, peak {peak / 2**20:.0f} MiB "
          f"(+{growth_mib:.1f} MiB)")
