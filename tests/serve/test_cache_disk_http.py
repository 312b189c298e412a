"""The disk prompt cache (--cache-disk) through served graphs: a prompt computed by one graph is
read from the folder by the graph deployed again (a restarted server: new replicas, nothing in
their RAM); timings.cache_n, /slots and /metrics count the tokens read as cached, and /metrics
has the disk tier's own counters. Two engines on one folder at once: tests/engine/
test_cache_disk.py (a third deployment here cost a minute and more on a loaded machine)."""

from __future__ import annotations

import httpx

from engine.disk_cache import EAGER_TOKENS
from engine.disk_files import NAME

from ..conftest import wait_for
from ..reliability import dedicated_app

# past the length whose entry is written as soon as it is made
PROMPT = "".join(f"value_{i} = compute({i}, scale={i % 7})\n" for i in range(110))
ARGS = {"n_parallel": 1, "n_ctx": 2048, "n_batch": 256, "metrics": True}
BODY = {"prompt": PROMPT, "n_predict": 4, "temperature": 0, "cache_prompt": True}


def scrape(base: str) -> dict[str, float]:
    text = httpx.get(base + "/metrics", timeout=30).text
    return {line.split(" ")[0]: float(line.split(" ")[1])
            for line in text.splitlines() if line and not line.startswith("#")}


def complete(base: str) -> dict:
    r = httpx.post(base + "/completion", json=BODY, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


def assert_read_from_disk(base: str, answer: dict, cold: dict) -> None:
    n = answer["timings"]["cache_n"]
    assert n == cold["tokens_evaluated"] - 1 and answer["content"] == cold["content"]
    (slot,) = httpx.get(base + "/slots", timeout=30).json()
    assert slot["n_prompt_tokens_cache"] == n
    metrics = scrape(base)
    assert metrics["mlxray:cache_disk_hits_total"] == 1
    assert metrics["mlxray:prompt_tokens_cache_disk_total"] == n
    assert metrics["llamacpp:prompt_tokens_cached_total"] == n


def test_a_restarted_graph_reads_the_prompt_from_disk(serve_instance, tmp_path):
    args = {**ARGS, "cache_disk": str(tmp_path)}
    with dedicated_app(serve_instance, "cache_disk_a", args) as first:
        cold = complete(first)
        assert cold["tokens_evaluated"] > EAGER_TOKENS and cold["timings"]["cache_n"] == 0
        assert scrape(first)["mlxray:cache_disk_hits_total"] == 0
        wait_for(lambda: any(NAME.match(p.name) for p in tmp_path.iterdir()), timeout=120,
                 what="the prompt's cache file")
    with dedicated_app(serve_instance, "cache_disk_a", args) as restarted:
        assert_read_from_disk(restarted, complete(restarted), cold)

