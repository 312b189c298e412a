"""The peer to beat: ``mlx_lm.server`` (it ships with mlx-lm) started here on the same model with
``--decode-concurrency`` = the slots, and one OpenAI streaming client (``/v1/completions``) that
drives it and the graph alike.

mlx_lm.server has no ``ignore_eos`` and stops batching for a request that carries a ``seed``: the
body has no seed, keeps every end-of-generation token out with ``logit_bias``, and the client
counts the tokens each server says it generated (``stream_options.include_usage``). Both servers
keep their own prompt caches on, as users run them; the prompts never repeat, so neither hits.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import aiohttp

from .graph import Progress, closed_loop, free_port, stop_group, wait_healthy
from .ratios import RequestTiming

EOS_BIAS = -1e9  # JSON has no -inf; greedy never picks a token this far down


@contextmanager
def serve_peer(model: str, n_parallel: int, log_path: Path,
               timeout: float = 180.0) -> Iterator[tuple[str, int]]:
    """Yield (base URL, PID) of a healthy mlx_lm.server in a session of its own; stop it and
    everything it started (its process group) on the way out, whatever the way out."""
    port = free_port()
    cmd = [sys.executable, "-m", "mlx_lm", "server", "--model", model, "--host", "127.0.0.1",
           "--port", str(port), "--decode-concurrency", str(n_parallel),
           "--log-level", "WARNING"]
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
        try:
            base = f"http://127.0.0.1:{port}"
            wait_healthy(base, proc, timeout, log_path)
            yield base, proc.pid
        finally:
            stop_group(proc)


def oai_body(prompt: str, n_tokens: int, eog_ids: list[int]) -> dict:
    return {"prompt": prompt, "max_tokens": n_tokens, "temperature": 0.0, "stream": True,
            "stream_options": {"include_usage": True},
            "logit_bias": {str(t): EOS_BIAS for t in eog_ids}}


async def stream_oai(session: aiohttp.ClientSession, base: str, body: dict) -> RequestTiming:
    """One streaming /v1/completions: TTFT at the first frame with text, the tokens from the
    usage frame (what the server says it generated)."""
    t0 = time.perf_counter()
    t_first = t_last = 0.0
    n_chunks = 0
    n_tokens = None
    buf = b""
    async with session.post(base + "/v1/completions", json=body) as resp:
        if resp.status != 200:
            raise RuntimeError(f"HTTP {resp.status}: {await resp.text()}")
        async for chunk in resp.content.iter_any():
            now = time.perf_counter()
            n_chunks += 1
            buf += chunk
            *frames, buf = buf.split(b"\n\n")
            for frame in frames:
                if not frame.startswith(b"data: ") or frame == b"data: [DONE]":
                    continue  # mlx_lm.server's ": keepalive" comments, the end marker
                event = json.loads(frame[6:])
                if not t_first and any(c.get("text") for c in event.get("choices") or ()):
                    t_first = now
                if event.get("usage"):
                    n_tokens = int(event["usage"]["completion_tokens"])
                    t_last = now
    if n_tokens is None:
        raise RuntimeError("the stream ended without a usage frame")
    t_first = t_first or t_last  # tokens whose text is empty (a split UTF-8 character) only
    return RequestTiming(t_first - t0, t_last - t0, n_tokens, n_chunks)


def run_oai(base: str, bodies: list[dict], concurrency: int,
            progress: Progress) -> tuple[list[RequestTiming], float]:
    """``bodies`` through ``base``'s /v1/completions, ``concurrency`` in flight (closed loop)."""
    return asyncio.run(closed_loop(stream_oai, base, bodies, concurrency, progress))
