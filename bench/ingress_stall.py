"""Does the ingress stay responsive while it works on a large body? (issue #28)

``python -m bench.ingress_stall``: starts the graph as ``make serve`` does (bench/graph.py's
``serve_graph``, the embedded model), sends one ``--mib`` MiB /completion prompt (16 MiB: the
default body limit), and while the ingress reads, tokenizes and refuses it (it is far over the
context) polls ``/health``, a small ``/tokenize`` and a one-token ``/completion`` back to back.
Prints each poller's latencies (p50, p99, max) over the requests sent while the large one was in
flight, then a request of ``--prompts`` one-character prompts (more than the queue can take:
refused with 503 before any is tokenized or queued) and the ordinary request after it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import random
import tempfile
import time
from pathlib import Path

import aiohttp

from .graph import serve_graph
from .ratios import percentile

SMALL = {
    "/health": None,
    "/tokenize": {"content": "def hello(name):"},
    "/completion": {"prompt": "def f(x):", "n_predict": 1, "cache_prompt": False},
}


def large_prompt(mib: float, seed: int = 0) -> str:
    """Varied code-like text (repeated text would hit the tokenizer's word cache)."""
    rng = random.Random(seed)
    words = ["".join(rng.choice("abcdefghijklmnopqrstuvwxyz_") for _ in range(rng.randint(2, 9)))
             for _ in range(5000)]
    size, parts = int(mib * 1024 * 1024) - 64, []
    total = 0
    while total < size:
        line = " ".join(rng.choices(words, k=8)) + "\n"
        parts.append(line)
        total += len(line)
    return "".join(parts)[:size]


async def poll(session: aiohttp.ClientSession, base: str, path: str, body: dict | None,
               done: asyncio.Event, out: list[float]) -> None:
    """Back-to-back requests until ``done``; the latency of each sent before it."""
    while not done.is_set():
        t0 = time.perf_counter()
        if body is None:
            async with session.get(base + path) as resp:
                await resp.read()
        else:
            async with session.post(base + path, json=body) as resp:
                await resp.read()
        if not done.is_set() or out == []:
            out.append(time.perf_counter() - t0)
        await asyncio.sleep(0.01)


def large_body(mib: float) -> bytes:
    """A /completion body of ``mib`` MiB (16: the default limit, max_body_bytes), its prompt
    trimmed by what JSON's escapes add."""
    prompt = large_prompt(mib)
    body = json.dumps({"prompt": prompt, "n_predict": 1}).encode()
    excess = len(body) - int(mib * 1024 * 1024)
    while excess > 0:
        prompt = prompt[:len(prompt) - excess]
        body = json.dumps({"prompt": prompt, "n_predict": 1}).encode()
        excess = len(body) - int(mib * 1024 * 1024)
    return body


async def during_large(base: str, mib: float) -> dict:
    body = large_body(mib)
    timeout = aiohttp.ClientTimeout(total=600)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        done = asyncio.Event()
        latencies: dict[str, list[float]] = {path: [] for path in SMALL}
        t0 = time.perf_counter()
        large = asyncio.ensure_future(session.post(
            base + "/completion", data=body, headers={"Content-Type": "application/json"}))
        await asyncio.sleep(0.2)  # the body is on its way: the pollers start behind it
        pollers = [asyncio.ensure_future(poll(session, base, path, small, done, latencies[path]))
                   for path, small in SMALL.items()]
        resp = await large
        status = resp.status
        await resp.read()
        elapsed = time.perf_counter() - t0
        done.set()
        await asyncio.gather(*pollers)
    return {"large_status": status, "large_bytes": len(body), "large_s": elapsed,
            "latencies": latencies}


async def many_prompts(base: str, n: int) -> dict:
    body = {"prompt": ["a"] * n, "n_predict": 1}
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as session:
        t0 = time.perf_counter()
        try:
            async with session.post(base + "/completion", json=body) as resp:
                refused = (resp.status, await resp.json(), time.perf_counter() - t0)
        except asyncio.TimeoutError:
            refused = (0, {"client": "gave up after 120 s"}, time.perf_counter() - t0)
        t0 = time.perf_counter()
        async with session.post(base + "/completion", json=SMALL["/completion"]) as resp:
            after = (resp.status, time.perf_counter() - t0)
    return {"n": n, "refused": refused, "after": after}


def report(result: dict, prompts: dict) -> None:
    print(f"large /completion: {result['large_bytes'] / 2**20:.1f} MiB body, "
          f"status {result['large_status']} after {result['large_s']:.1f} s")
    for path, values in result["latencies"].items():
        ms = sorted(v * 1000 for v in values) or [math.nan]
        print(f"{path:12s} n={len(ms):4d}  p50 {percentile(ms, 50):9.1f} ms  "
              f"p99 {percentile(ms, 99):9.1f} ms  max {ms[-1]:9.1f} ms")
    if not prompts:
        return
    status, body, seconds = prompts["refused"]
    print(f"{prompts['n']} prompts: status {status} in {seconds * 1000:.0f} ms: "
          f"{json.dumps(body)[:120]}")
    print(f"the ordinary request after it: status {prompts['after'][0]} in "
          f"{prompts['after'][1] * 1000:.0f} ms")


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m bench.ingress_stall", description=__doc__)
    p.add_argument("--model", default="models/tiny-python")
    p.add_argument("--mib", type=float, default=16.0, help="the large body's size (default 16)")
    p.add_argument("--prompts", type=int, default=1_000_000,
                   help="prompts in the many-prompts request (default a million; 0: none)")
    args = p.parse_args()
    log = Path(tempfile.gettempdir()) / "mlxray-bench-ingress-stall.log"
    with serve_graph(args.model, n_parallel=2, n_ctx=2048, n_batch=512, log_path=log) as (
            base, _):
        result = asyncio.run(during_large(base, args.mib))
        prompts = asyncio.run(many_prompts(base, args.prompts)) if args.prompts else {}
    report(result, prompts)


if __name__ == "__main__":
    main()
