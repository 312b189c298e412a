"""A model replica sharded over two ranks (the Serve replica and one Ray actor, MLX's ring backend
over TCP on this machine's CPU): greedy output token for token equal to mlx-lm's unsharded model,
batched and streamed, split by layers (pipeline) and by heads (tensor); a rank killed mid-stream
ends the stream with an error frame, fails the replica's health check, and Ray Serve brings a
whole new replica (new ranks) up. The command line's --shards, --shard-mode and -sm.
configs/sharded.yaml on a cluster of two device nodes (one rank on each) runs in
tests/multinode_cluster.py, on the cluster that tests/serve/test_multinode.py starts in its own
process."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import time

import httpx
import pytest

from .. import conftest
from ..reliability import Frames, dedicated_app, engine_state

PROMPTS = [[5, 6, 7, 8, 9, 10], [100, 200, 300], [42] * 20 + [7, 8], [1500, 3, 77, 91, 12]]
N = 12
GREEDY = {"n_predict": N, "temperature": 0, "return_tokens": True, "ignore_eos": True,
          "cache_prompt": False}


@pytest.fixture(scope="module")
def expected() -> list[list[int]]:
    from mlx_lm import load

    model, _ = load(conftest.MODEL)
    return [conftest.mlx_lm_ids(model, p, N) for p in PROMPTS]


@pytest.fixture(scope="module")
def sharded_app(serve_instance: int):
    """(name, base URL) of the sharded application of a split, started on first use; both stay
    up for the module."""
    with contextlib.ExitStack() as stack:
        started: dict[str, tuple[str, str]] = {}

        def app(mode: str) -> tuple[str, str]:
            if mode not in started:
                name = f"sharded-{mode}"
                args = {"shards": 2, "shard_mode": mode, "n_parallel": 4, "n_ctx": 512,
                        "device": "cpu"}
                base = stack.enter_context(dedicated_app(serve_instance, name, args,
                                                         {"health_check_period_s": 1}))
                started[mode] = (name, base)
            return started[mode]

        yield app


@pytest.fixture(params=["pipeline", "tensor"])
def sharded(request, sharded_app) -> tuple[str, str]:
    return sharded_app(request.param)


async def _completion(client: httpx.AsyncClient, prompt: list[int]) -> list[int]:
    r = await client.post("/completion", json={"prompt": prompt, **GREEDY})
    assert r.status_code == 200, r.text
    return r.json()["tokens"]


async def _streamed(client: httpx.AsyncClient, prompt: list[int]) -> list[int]:
    tokens: list[int] = []
    async with client.stream("POST", "/completion",
                             json={"prompt": prompt, "stream": True, **GREEDY}) as r:
        assert r.status_code == 200
        for frame in await Frames(r).rest():
            assert "error" not in frame, frame
            tokens += frame.get("tokens", [])
    return tokens


def test_sharded_greedy_output_equals_the_unsharded_model(sharded, expected):
    """Every prompt at once (the engine batches them), then streamed, then one request of
    several prompts: the same ids as mlx-lm's generate_step on the whole model."""
    name, base = sharded

    async def scenario():
        async with httpx.AsyncClient(base_url=base, timeout=60) as client:
            batched = await asyncio.gather(*(_completion(client, p) for p in PROMPTS))
            streamed = await asyncio.gather(*(_streamed(client, p) for p in PROMPTS))
            r = await client.post("/completion", json={"prompt": PROMPTS[:2], **GREEDY})
            multi = [item["tokens"] for item in r.json()]
        return batched, streamed, multi

    batched, streamed, multi = asyncio.run(asyncio.wait_for(scenario(), 90))
    assert batched == expected
    assert streamed == expected
    assert multi == expected[:2]
    assert_lockstep(name)


LOCKSTEP_KEYS = ("n_active", "n_waiting", "n_sequences", "slots_idle", "n_decode_total",
                 "n_cancelled", "n_submitted")


def idle_state(name: str) -> dict:
    return conftest.wait_for(lambda: (s := engine_state(name))["n_active"] == 0 and s,
                             timeout=30, what="an idle engine")


def assert_lockstep(name: str) -> None:
    """The other rank is another process that took every step rank 0 took, and ended idle."""
    state = idle_state(name)
    (rank,) = state["shard_states"]
    assert rank["pid"] == state["shard_pids"][0] != state["pid"]
    assert state["n_decode_total"] > 0
    assert {k: rank[k] for k in LOCKSTEP_KEYS} == {k: state[k] for k in LOCKSTEP_KEYS}


def test_an_idle_rank_waits_outside_the_collective(sharded_app, expected):
    """Idle, rank 0 sends no turns: the other rank waits on its wake, not in MLX's ring
    collective (which polls its sockets: an idle rank held 40-80% of a core), and the first
    request after the idle spell is served as before."""
    import psutil

    name, base = sharded_app("pipeline")
    state = idle_state(name)
    rank = psutil.Process(state["shard_pids"][0])
    turns, cpu = state["shard_states"][0]["n_turns"], sum(rank.cpu_times()[:2])
    time.sleep(3)
    state = engine_state(name)
    assert state["shard_states"][0]["n_turns"] == turns  # nothing broadcast while idle
    assert sum(rank.cpu_times()[:2]) - cpu < 0.6  # under a fifth of a core
    r = httpx.post(f"{base}/completion", json={"prompt": PROMPTS[0], **GREEDY}, timeout=60)
    assert r.status_code == 200 and r.json()["tokens"] == expected[0]
    assert_lockstep(name)


def test_seeded_sampling_equals_the_unsharded_replica(sharded_app, base_url):
    """A seeded request samples the same tokens as on the suite's unsharded replica: the seed
    travels with the request to every rank. The pipeline split computes the same logits bit for
    bit (tensor sums partial products in another order, so a draw may land apart: not asked)."""
    _, base = sharded_app("pipeline")
    seeded = {"seed": 1234, "temperature": 1.0, "n_predict": N, "ignore_eos": True,
              "return_tokens": True, "cache_prompt": False}

    def tokens(url: str) -> list[list[int]]:
        return [httpx.post(url + "/completion", json={"prompt": p, **seeded}, timeout=60)
                .json()["tokens"] for p in PROMPTS[:2]]

    assert tokens(base) == tokens(base_url)


def test_one_replica_to_the_ingress(sharded):
    """/props and /slots answer as for one replica: the whole model's size, the slots once."""
    _, base = sharded
    props = httpx.get(base + "/props", timeout=30).json()
    slots = httpx.get(base + "/slots", timeout=30).json()
    assert props["total_slots"] == 4 and len(slots) == 4
    models = httpx.get(base + "/v1/models", timeout=30).json()
    meta = models["data"][0]["meta"]
    config = json.loads((conftest.REPO / "models" / "tiny-python" / "config.json").read_text())
    assert meta["n_embd"] == config["hidden_size"]
    assert meta["n_params"] == 807552  # the whole model's, not one rank's part


def test_a_time_limit_stops_every_rank_alike(sharded, expected):
    """t_max_predict_ms stops a sequence at a new line past the limit on rank 0's clock: every
    rank stops it at the same token, and the ranks go on in lockstep."""
    name, base = sharded
    limited = {"prompt": "def f(x):\n", "n_predict": 400, "temperature": 0,
               "t_max_predict_ms": 1, "ignore_eos": True}
    r = httpx.post(base + "/completion", json=limited, timeout=60)
    assert r.status_code == 200, r.text
    assert r.json()["stop_type"] == "limit" and r.json()["tokens_predicted"] < 400
    after = httpx.post(base + "/completion", json={"prompt": PROMPTS[0], **GREEDY}, timeout=60)
    assert after.json()["tokens"] == expected[0]
    assert_lockstep(name)


def test_work_outside_the_lockstep_is_refused(sharded):
    """Embeddings would run the model on rank 0 alone: a 501 saying so."""
    name, _ = sharded
    from ray import serve

    replica = serve.get_deployment_handle("ModelReplica", app_name=name)
    answer = replica.embed.remote([[5, 6, 7]], "mean").result(timeout_s=30)
    assert answer["error"]["code"] == 501 and "sharded replica" in answer["error"]["message"]
    answer = replica.slot_action.remote(0, "erase", None, "").result(timeout_s=30)
    assert answer["error"]["code"] == 501


def test_a_rank_killed_mid_stream_fails_the_replica_and_serve_replaces_it(sharded_app):
    """On the tensor split (the kill is the same for both): the stream ends with an error frame
    and Serve brings a whole new replica up."""
    name, base = sharded_app("tensor")
    state = engine_state(name)
    pid, rank_pid = state["pid"], state["shard_pids"][0]
    endless = {"prompt": [5, 6, 7], "n_predict": 100000, "ignore_eos": True, "stream": True,
               "temperature": 0}

    async def scenario():
        async with httpx.AsyncClient(base_url=base, timeout=60) as client:
            async with client.stream("POST", "/completion", json=endless) as running:
                frames = Frames(running)
                await frames.next()
                os.kill(rank_pid, signal.SIGKILL)
                return await frames.rest()

    rest = asyncio.run(asyncio.wait_for(scenario(), 60))
    assert "error" in rest[-1] and rest[-1]["error"]["code"] in (500, 503)
    from ray import serve

    killed_at = time.monotonic()
    replica = serve.get_deployment_handle("ModelReplica", app_name=name)
    try:  # the old replica fails it, unless Serve has already replaced it for failing it
        replica.check_health.remote().result(timeout_s=30)
    except Exception as exc:  # noqa: BLE001 - the health check's own error, checked here
        assert re.search("engine loop died|shard rank", str(exc)), exc
    conftest.wait_for(lambda: _serves(base), timeout=120, what="a new sharded replica")
    new = engine_state(name)
    # the old replica's process lived on after its rank died: only its failed health check
    # makes Serve replace it
    assert new["pid"] != pid and new["shard_pids"] and new["shard_pids"][0] != rank_pid
    took = time.monotonic() - killed_at
    print(f"\nrank SIGKILL: a new sharded replica served after {took:.1f} s")


def _serves(base: str) -> bool:
    try:
        r = httpx.post(base + "/completion", json={"prompt": [5, 6], **GREEDY}, timeout=15)
    except httpx.HTTPError:
        return False
    return r.status_code == 200


def test_command_line_shards():
    from deployments.cli import command as cli

    def args(*argv: str):
        return cli.graph_args(cli.parse(list(argv), {}))

    assert (args().shards, args().shard_mode) == (1, "pipeline")
    assert (args("--shards", "2").shards, args("--shards", "2").shard_mode) == (2, "pipeline")
    assert args("--shards", "2", "-sm", "row").shard_mode == "tensor"
    assert args("--shards", "2", "--split-mode", "layer").shard_mode == "pipeline"
    assert args("--shards", "2", "--shard-mode", "tensor").shard_mode == "tensor"
    assert cli.graph_args(cli.parse(["--shards", "2"], {"LLAMA_ARG_SPLIT_MODE": "row"})
                          ).shard_mode == "tensor"
    with pytest.raises(ValueError, match="-sm none"):
        args("--shards", "2", "-sm", "none")
    with pytest.raises(cli.Refused, match="--split-mode"):
        cli.parse(["--split-mode", "diagonal"], {})


def test_config_refuses_what_a_sharded_replica_cannot_do(tmp_path):
    from deployments.api.config import GraphArgs

    with pytest.raises(ValueError, match="adapters"):
        GraphArgs.model_validate({"shards": 2, "adapter": str(tmp_path)})
    with pytest.raises(ValueError, match="shard_mode"):
        GraphArgs.model_validate({"shards": 2, "shard_mode": "row"})
    assert GraphArgs.model_validate({"shards": 2}).shard_mode == "pipeline"
