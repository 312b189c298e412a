"""Through the graph: the graph served as ``make serve`` serves it (``python -m
deployments.cli.launch``: its port served by the ingress replica, or through Ray Serve's proxy with
``serve_proxy``), started here on a free port, streamed over HTTP by an aiohttp client,
``concurrency`` requests in flight; stopped by its PID at the end."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import aiohttp
import yaml

from deployments.cli.launch import CLUSTER_ENV

from . import REPO
from .ratios import RequestTiming
from .workload import Workload, completion_body

# one request streamed: (session, base URL, body) -> its timing
StreamOne = Callable[[aiohttp.ClientSession, str, dict], Awaitable[RequestTiming]]

Progress = Callable[[], None]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def graph_config(model: str, port: int, n_parallel: int, n_ctx: int, n_batch: int,
                 stream_channel: str = "shared", extra_args: dict | None = None) -> dict:
    """configs/local.yaml with the bench's model, slots, port, stream channel and any other
    ``extra_args`` of the graph."""
    config = yaml.safe_load((REPO / "configs" / "local.yaml").read_text())
    config["http_options"]["port"] = port
    app = config["applications"][0]
    app["args"].update({"model": model, "n_parallel": n_parallel, "n_ctx": n_ctx,
                        "n_batch": n_batch, "max_queue": 4096,
                        "stream_channel": stream_channel, **(extra_args or {})})
    for deployment in app.get("deployments", []):
        if deployment.get("name") == "ModelReplica":
            deployment["max_ongoing_requests"] = max(64, 4 * n_parallel)
    return config


@contextmanager
def serve_graph(model: str, n_parallel: int, n_ctx: int, n_batch: int,
                log_path: Path, timeout: float = 240.0, attempts: int = 3,
                serve_proxy: bool = False, stream_channel: str = "shared",
                extra_args: dict | None = None) -> Iterator[tuple[str, int]]:
    """Yield (base URL, PID) of a healthy graph; stop it (its process group, by PID).

    A local cluster whose GCS misses Ray's 30 s startup deadline (a loaded machine) exits at once;
    that start is retried, up to ``attempts`` in all."""
    for attempt in range(1, attempts + 1):
        port = free_port()
        with tempfile.NamedTemporaryFile("w", suffix=".yaml", prefix="mlxray-bench-",
                                         delete=False) as f:
            yaml.safe_dump(graph_config(model, port, n_parallel, n_ctx, n_batch, stream_channel,
                                        extra_args), f)
        # mlxray's cluster settings: the proxy's gRPC, and the workers at nice 0 like the
        # engines driven here and mlx_lm.server (Ray's own default, 15, would measure the nice
        # levels on a shared machine)
        env = {**CLUSTER_ENV, **os.environ}
        env.pop("RAY_ADDRESS", None)  # a cluster of its own, never one it would then shut down
        command = [sys.executable, "-m", "deployments.cli.launch", f.name]
        log = open(log_path, "wb")
        proc = subprocess.Popen(command + (["--serve-proxy"] if serve_proxy else []), cwd=REPO,
                                env=env, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
        base = f"http://127.0.0.1:{port}"
        try:
            try:
                wait_healthy(base, proc, timeout, log_path)
            except ServeExited:
                if attempt == attempts:
                    raise
                continue
            yield base, proc.pid
            return
        finally:
            stop_group(proc, signal.SIGINT, grace=30)  # the launcher stops its cluster
            log.close()
            os.unlink(f.name)


class ServeExited(RuntimeError):
    pass


def wait_healthy(base: str, proc: subprocess.Popen, timeout: float, log_path: Path) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            command = " ".join(map(str, proc.args[:4]))
            raise ServeExited(f"{command} exited ({proc.returncode}); see {log_path}")
        try:
            with urllib.request.urlopen(base + "/health", timeout=5) as resp:
                if resp.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.5)
    raise TimeoutError(f"{base} did not become healthy in {timeout:.0f} s; see {log_path}")


def stop_group(proc: subprocess.Popen, first: int = signal.SIGTERM, grace: float = 15.0) -> None:
    """``first`` to the process group of a server started in a session of its own, then, after
    ``grace`` seconds at most, SIGKILL to whatever is left of it (children that outlived the
    leader included)."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, first)
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            pass
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


async def stream_one(session: aiohttp.ClientSession, base: str, body: dict) -> RequestTiming:
    """One streaming /completion: TTFT at the first frame, tokens from the final frame."""
    t0 = time.perf_counter()
    t_first = 0.0
    n_chunks = 0
    buf = b""
    final: dict | None = None
    async with session.post(base + "/completion", json=body) as resp:
        if resp.status != 200:
            raise RuntimeError(f"HTTP {resp.status}: {await resp.text()}")
        async for chunk in resp.content.iter_any():
            now = time.perf_counter()
            if not t_first:
                t_first = now
            n_chunks += 1
            buf += chunk
            *frames, buf = buf.split(b"\n\n")
            for frame in frames:
                if frame.startswith(b"data: ") and b'"stop":true' in frame:
                    final = json.loads(frame[6:])
                    t_last = now
    if final is None:
        raise RuntimeError("the stream ended without a final frame")
    return RequestTiming(t_first - t0, t_last - t0, int(final["tokens_predicted"]), n_chunks)


async def closed_loop(stream: StreamOne, base: str, bodies: list[dict], concurrency: int,
                      progress: Progress) -> tuple[list[RequestTiming], float]:
    """``bodies`` through ``stream``, ``concurrency`` requests in flight; (timings, wall time)."""
    pending = list(reversed(bodies))
    done: list[RequestTiming] = []
    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=600)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        async def worker() -> None:
            while pending:
                done.append(await stream(session, base, pending.pop()))
                progress()

        start = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        wall = time.perf_counter() - start
    return done, wall


def run_graph(base: str, work: Workload, concurrency: int, n_requests: int,
              progress: Progress) -> tuple[list[RequestTiming], float]:
    bodies = [work.body(i) for i in range(n_requests)]
    return asyncio.run(closed_loop(stream_one, base, bodies, concurrency, progress))


def run_prefix(base: str, prompts: list[list[int]],
               progress: Progress) -> tuple[list[float], list[float]]:
    """TTFT (ms) of each long prompt sent cold, then of the same prompt sent again (warm)."""
    async def go() -> tuple[list[float], list[float]]:
        cold, warm = [], []
        async with aiohttp.ClientSession() as session:
            for prompt in prompts:
                for out in (cold, warm):
                    body = completion_body(prompt, 1, stream=True, cache_prompt=True)
                    out.append((await stream_one(session, base, body)).ttft * 1e3)
                    progress()
        return cold, warm

    return asyncio.run(go())


ROLES = ("ModelReplica", "ResponseShaper", "Ingress", "ProxyActor", "ServeController", "raylet",
         "gcs_server")


def session_cpu(sid: int) -> dict[str, float]:
    """CPU seconds used so far by each role among the processes of session ``sid`` (the
    launcher and the local cluster it started), through psutil: Linux and macOS alike."""
    import psutil  # the bench's own dependency (pip install -e ".[bench]"), imported when used

    out: dict[str, float] = {}
    for proc in psutil.process_iter(["cmdline"]):
        try:
            if os.getsid(proc.pid) != sid:
                continue
            times = proc.cpu_times()
        except (psutil.Error, OSError):  # gone meanwhile, or not ours to read
            continue
        cmd = " ".join(proc.info["cmdline"] or ())
        role = next((r for r in ROLES if r in cmd), "other")
        out[role] = out.get(role, 0.0) + times.user + times.system
    return out
