"""LoRA adapters over HTTP: GET and POST /lora-adapters as the reference answers them, the
``lora`` field (validation, echo, per-request scales mixed in one batch), a request's ``model``
naming an adapter, adapters loaded on demand from ``lora_dir``, and Ray Serve's model
multiplexing across two replicas: each on-demand adapter is loaded once per replica and the
repeats go to the replica that holds it.

One application: two model replicas of the embedded model, adapters ``a`` and ``b`` loaded at
start (ids 0 and 1), ``p`` and ``q`` in ``lora_dir``, at most one on-demand adapter per
replica. Expected outputs are mlx-lm's own greedy generations with each adapter loaded."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from ..adapters import mlx_lm_greedy, write_adapter
from ..reliability import dedicated_app

APP = "adapters"
PROMPT = "def main():\n"
N = 12
GREEDY = {"prompt": PROMPT, "n_predict": N, "temperature": 0, "cache_prompt": False,
          "return_tokens": True}


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("adapters")
    lora_dir = root / "lora_dir"
    return {
        "a": write_adapter(root / "a", seed=1),
        "b": write_adapter(root / "b", seed=2, num_layers=1,
                           keys=["self_attn.q_proj", "self_attn.v_proj"]),
        "p": write_adapter(lora_dir / "p", seed=3),
        "q": write_adapter(lora_dir / "q", seed=4),
        "lora_dir": lora_dir,
    }


@pytest.fixture(scope="module")
def expected(folders) -> dict[str, list[int]]:
    """mlx-lm's greedy tokens: the base model, and each adapter loaded by mlx_lm.utils.load."""
    out = {"base": mlx_lm_greedy(PROMPT, N)}
    out.update({name: mlx_lm_greedy(PROMPT, N, folders[name]) for name in "abp"})
    return out


@pytest.fixture(scope="module")
def client(serve_instance: int, folders) -> Iterator[httpx.Client]:
    args = {"alias": "tiny", "n_parallel": 4, "n_ctx": 256, "n_batch": 64,
            "adapters": [str(folders["a"]), {"path": str(folders["b"]), "scale": 0.5}],
            "lora_dir": str(folders["lora_dir"]), "max_adapters_per_replica": 1}
    replicas = {"num_replicas": 2, "ray_actor_options": {"num_cpus": 0.25}}
    with dedicated_app(serve_instance, APP, args, replicas) as base:
        with httpx.Client(base_url=base, timeout=120) as c:
            yield c


def tokens(client: httpx.Client, **body) -> list[int]:
    r = client.post("/completion", json={**GREEDY, **body})
    assert r.status_code == 200, r.text
    return r.json()["tokens"]


def set_scales(client: httpx.Client, scales: list) -> None:
    r = client.post("/lora-adapters", json=scales)
    assert (r.status_code, r.json()) == (200, {"success": True})


# ---- /lora-adapters --------------------------------------------------------------------------
def test_get_lists_the_adapters_loaded_at_start(client, folders):
    r = client.get("/lora-adapters")
    assert r.status_code == 200
    assert r.json()[:2] == [
        {"id": 0, "path": str(folders["a"]), "scale": 1.0, "task_name": "", "prompt_prefix": ""},
        {"id": 1, "path": str(folders["b"]), "scale": 0.5, "task_name": "", "prompt_prefix": ""},
    ]


def test_post_sets_the_global_scales_unlisted_at_zero(client):
    try:
        set_scales(client, [{"id": 1, "scale": 0.25}, {"id": 7, "scale": 3}, "junk"])
        scales = [a["scale"] for a in client.get("/lora-adapters").json()[:2]]
        assert scales == [0.0, 0.25]
        r = client.post("/lora-adapters", json={"id": 0, "scale": 1})
        assert (r.status_code, r.json()) == (400, {"error": {
            "code": 400, "message": "Request body must be an array",
            "type": "invalid_request_error"}})
    finally:
        set_scales(client, [{"id": 0, "scale": 1.0}, {"id": 1, "scale": 0.5}])


def test_requests_without_lora_run_at_the_global_scales_on_every_replica(client, expected):
    try:
        set_scales(client, [{"id": 0, "scale": 1.0}])
        assert all(tokens(client) == expected["a"] for _ in range(4))
        set_scales(client, [])
        assert all(tokens(client) == expected["base"] for _ in range(4))
    finally:
        set_scales(client, [{"id": 0, "scale": 1.0}, {"id": 1, "scale": 0.5}])


# ---- the lora field --------------------------------------------------------------------------
def test_lora_ids_pick_adapters_and_scale_zero_is_the_base(client, expected):
    assert tokens(client, lora=[{"id": 0, "scale": 1.0}]) == expected["a"]
    assert tokens(client, lora=[{"id": 1, "scale": 1.0}]) == expected["b"]
    assert tokens(client, lora=[{"id": 0, "scale": 0.0}]) == expected["base"]
    assert tokens(client, lora=[{"id": 42, "scale": 1.0}]) == expected["base"]  # unknown: ignored


def test_lora_is_validated_and_echoed_as_the_reference(client):
    r = client.post("/completion", json={**GREEDY, "lora": {"id": 0}})
    assert (r.status_code, r.json()["error"]["message"]) == (
        400, "Field 'lora': Error: 'lora' must be an array of objects with 'id' and 'scale' "
             "fields")
    body = {**GREEDY, "n_predict": 1,
            "lora": [{"id": 1, "scale": 0.1}, {"id": 0}, 5, {"id": 1, "scale": 2}]}
    echoed = client.post("/completion", json=body).json()["generation_settings"]["lora"]
    # parse_lora_request: a map by id (the last wins); a missing id is -1, a missing scale 0
    assert echoed == [{"id": -1, "scale": 0.0}, {"id": 0, "scale": 0.0}, {"id": 1, "scale": 2.0}]


def test_different_adapters_run_in_one_batch_and_each_equals_its_own(client, expected):
    bodies = [{}, {"lora": [{"id": 0, "scale": 1}]}, {"lora": [{"id": 1, "scale": 1}]},
              {"lora": [{"id": 0, "scale": 0}]}] * 2
    want = [expected["base"], expected["a"], expected["b"], expected["base"]] * 2

    async def together() -> list[list[int]]:
        async with httpx.AsyncClient(base_url=str(client.base_url), timeout=120) as ac:
            rs = await asyncio.gather(*(ac.post("/completion", json={**GREEDY, **b,
                                                                      "lora": b.get("lora", [])})
                                        for b in bodies))
        return [r.json()["tokens"] for r in rs]

    set_scales(client, [])  # "no lora" is the base here
    try:
        assert asyncio.run(together()) == want
    finally:
        set_scales(client, [{"id": 0, "scale": 1.0}, {"id": 1, "scale": 0.5}])


# ---- a model that names an adapter -----------------------------------------------------------
def test_model_may_name_an_adapter_and_lora_scales_on_top(client, expected):
    names = [m["id"] for m in client.get("/v1/models").json()["data"]]
    assert names[:3] == ["tiny", "a", "b"]
    assert tokens(client, model="a") == expected["a"]
    assert tokens(client, model="a", lora=[{"id": 0, "scale": 0}]) == expected["base"]
    assert tokens(client, model="tiny", lora=[{"id": 0, "scale": 1}]) == expected["a"]


def test_an_adapter_of_lora_dir_is_loaded_on_demand(client, folders, expected):
    oai = openai.OpenAI(base_url=str(client.base_url).rstrip("/") + "/v1", api_key="unused")
    out = oai.completions.create(model="p", prompt=PROMPT, max_tokens=N, temperature=0)
    assert out.model == "p"
    assert tokens(client, model="p") == expected["p"]
    listed = client.get("/lora-adapters").json()
    assert listed[2] == {"id": 2, "path": str(folders["lora_dir"] / "p"), "scale": 1.0,
                         "task_name": "", "prompt_prefix": ""}
    assert tokens(client, lora=[{"id": 2, "scale": 1}]) == expected["p"]
    r = client.post("/completion", json={**GREEDY, "model": "../a"})
    assert r.status_code == 200  # one model: an unknown name is ignored, as the reference does


# ---- multiplexing ----------------------------------------------------------------------------
def adapter_states() -> dict[int, dict]:
    """Every replica's adapter state, by process id (calls spread over both replicas)."""
    from ray import serve

    handle = serve.get_deployment_handle("ModelReplica", app_name=APP)
    states: dict[int, dict] = {}
    deadline = time.monotonic() + 60
    while len(states) < 2 and time.monotonic() < deadline:
        state = handle.adapter_state.remote().result(timeout_s=30)
        states[state["pid"]] = state
    assert len(states) == 2
    return states


def wait_routed(name: str) -> None:
    """Until routing knows which replica holds ``name`` (replicas report it every 0.1 s): a
    handle call with that multiplexed id lands on a holder several times in a row."""
    from ray import serve

    handle = serve.get_deployment_handle("ModelReplica", app_name=APP).options(
        multiplexed_model_id=name)
    deadline, in_a_row = time.monotonic() + 60, 0
    while in_a_row < 5:
        assert time.monotonic() < deadline, f"{name}: no replica reported holding it"
        state = handle.adapter_state.remote().result(timeout_s=30)
        in_a_row = in_a_row + 1 if name in state["loaded"] else 0
        time.sleep(0.1)


def test_multiplexing_loads_each_adapter_once_and_routes_repeats_to_it(client):
    tokens(client, model="q")
    wait_routed("q")
    for _ in range(8):
        tokens(client, model="q")
    states = adapter_states().values()
    assert sorted(state["loads"].get("q", 0) for state in states) == [0, 1]
    # at most one on-demand adapter per replica (max_adapters_per_replica): the LRU unloads
    assert all(len(set(state["loaded"]) - {"a", "b"}) <= 1 for state in states)
