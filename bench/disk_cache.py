"""The disk prompt cache (issue #37). By default through the served graph (``python -m
deployments.cli.launch``, as ``make serve`` runs it, on a free port): a 4,000-token prompt read
cold by a server with ``cache_disk``; the server stopped and started again on the same folder
(the restart), the prompt read warm from disk; then RAM hits on that server and on one
without the tier started beside it, in turn. ``--engine`` measures the same on the engine
alone (no Ray, no HTTP).

Prints disk_warm_vs_cold_ttft (target <= 0.25) and ram_hit_ttft_ratio (with / without the tier;
target 1 +- 0.05). TTFT is the time to the first streamed frame of a one-token /completion.

    .venv/bin/python -m bench.disk_cache [--tokens 4000] [--model models/tiny-python] [--engine]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import httpx

from engine.disk_files import NAME

from .graph import serve_graph

WARM_UP = "import os\n\nprint(os.getcwd())\n"  # the kernels, on a prompt that shares nothing


def prompt_text(n_tokens: int) -> str:
    return "".join(f"value_{i} = compute({i}, scale={i % 7})\n" for i in range(n_tokens))


def first_token(base: str, prompt: list[int] | str) -> tuple[float, int]:
    """Seconds to the first streamed frame of a one-token /completion, and its cache_n."""
    body = {"prompt": prompt, "n_predict": 1, "temperature": 0, "cache_prompt": True,
            "stream": True}
    start, ttft, final = time.perf_counter(), 0.0, None
    with httpx.stream("POST", base + "/completion", json=body, timeout=600) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if line.startswith("data: "):
                ttft = ttft or time.perf_counter() - start
                frame = json.loads(line[6:])
                final = frame if frame.get("stop") else final
    if final is None:
        raise RuntimeError("the stream ended without a final frame")
    return ttft, int(final["timings"]["cache_n"])


def tokens_of(base: str, n_tokens: int) -> list[int]:
    r = httpx.post(base + "/tokenize", json={"content": prompt_text(n_tokens)}, timeout=120)
    return r.json()["tokens"][:n_tokens]


def wait_for_file(folder: Path, n_tokens: int, timeout: float = 120.0) -> None:
    """Until the writer has put an entry of the whole prompt in the folder."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if any((m := NAME.match(p.name)) and int(m.group(4)) >= n_tokens
               for p in folder.iterdir()):
            return
        time.sleep(0.2)
    raise TimeoutError(f"no cache file of {n_tokens} tokens in {folder}")


def server_run(a: argparse.Namespace) -> tuple[float, float, int, float, float]:
    n_ctx = a.tokens + 64
    logs = Path(tempfile.gettempdir())

    def served(name: str, extra: dict):
        return serve_graph(a.model, 1, n_ctx, 512, logs / f"mlxray-bench-disk-{name}.log",
                           extra_args={"metrics": True, **extra})

    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        disk = {"cache_disk": str(folder)}
        with served("cold", disk) as (base, _):
            prompt = tokens_of(base, a.tokens)
            first_token(base, WARM_UP)
            cold, _ = first_token(base, prompt)
            wait_for_file(folder, len(prompt))
        # the restarted server and one without the tier side by side, their RAM hits taken in
        # turn: the machine's load weighs on both alike
        with served("restarted", disk) as (base, _), served("plain", {}) as (plain, _):
            first_token(base, WARM_UP)
            warm, from_disk = first_token(base, prompt)
            first_token(plain, WARM_UP)
            first_token(plain, prompt)
            hits: dict[str, list[float]] = {base: [], plain: []}
            for _ in range(a.repeats):
                for server, times in hits.items():
                    times.append(first_token(server, prompt)[0])
    ram_disk, ram_plain = (statistics.median(hits[server]) for server in (base, plain))
    return cold, warm, from_disk, ram_disk, ram_plain


def engine_run(a: argparse.Namespace) -> tuple[float, float, int, float, float]:
    from engine.model import load_model
    from engine.scheduler import Engine, EngineConfig
    from engine.types import FinalEvent, GenerationRequest, SamplingParams
    from tests.conftest import run_engine

    def ttft(engine: Engine, prompt: list[int]) -> tuple[float, int]:
        req = GenerationRequest(prompt, SamplingParams(temperature=0.0), n_predict=1)
        start = time.perf_counter()
        final = next(e for e in run_engine(engine, req) if isinstance(e, FinalEvent))
        return time.perf_counter() - start, final.timings.cache_n

    def started(folder: str | None) -> Engine:
        eng = Engine(load_model(a.model), EngineConfig(n_parallel=1, n_ctx=a.tokens + 64,
                                                       n_batch=512, cache_disk=folder))
        eng.start()
        return eng

    with tempfile.TemporaryDirectory() as folder:
        first = started(folder)
        prompt = first.vocab.tokenize(prompt_text(a.tokens), add_special=True)[: a.tokens]
        ttft(first, prompt[:64])
        cold, _ = ttft(first, prompt)
        first.stop()  # the restart: the writer has finished
        restarted = started(folder)
        ttft(restarted, prompt[:64])
        warm, from_disk = ttft(restarted, prompt)
        ram_disk = statistics.median(ttft(restarted, prompt)[0] for _ in range(a.repeats))
        restarted.stop()
    plain = started(None)
    ttft(plain, prompt)
    ram_plain = statistics.median(ttft(plain, prompt)[0] for _ in range(a.repeats))
    plain.stop()
    return cold, warm, from_disk, ram_disk, ram_plain


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="models/tiny-python")
    ap.add_argument("--tokens", type=int, default=4000)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--engine", action="store_true", help="the engine alone, no server")
    a = ap.parse_args()
    cold, warm, from_disk, ram_disk, ram_plain = (engine_run if a.engine else server_run)(a)
    print(f"{'engine' if a.engine else 'restarted server'}: prompt_tokens {a.tokens} "
          f"cold_ttft_s {cold:.4f} disk_warm_ttft_s {warm:.4f} (cache_n {from_disk})")
    print(f"disk_warm_vs_cold_ttft {warm / cold:.3f}")
    print(f"ram_hit_ttft_s with_disk {ram_disk:.4f} without {ram_plain:.4f} "
          f"ram_hit_ttft_ratio {ram_disk / ram_plain:.3f}")


if __name__ == "__main__":
    main()
