"""Many replicas, one server (issue #29): /metrics, /slots, /props and the slot actions answer
for every replica of a model, on a real two-replica Ray Serve application of the embedded model.
The replica kill runs last: it changes the application the others read."""

from __future__ import annotations

import asyncio
import re
import time

import httpx
import pytest

from deployments.serve.status import REPORT_PERIOD_S
from tests.conftest import MODEL, wait_for

APP = "replicas"
N_PARALLEL = 2


@pytest.fixture(scope="module")
def two(deploy_app, tmp_path_factory) -> str:
    folder = tmp_path_factory.mktemp("slot-files")
    base = deploy_app(APP, {"model": MODEL, "n_parallel": N_PARALLEL, "n_ctx": 512,
                            "metrics": True, "slot_save_path": str(folder)},
                      replica_options={"num_replicas": 2, "health_check_period_s": 1})
    wait_for(lambda: len(replica_ids(base)) == 2, 180, "both replicas in /slots")
    return base


def replica_ids(base: str) -> set[str]:
    r = httpx.get(base + "/slots", timeout=30)
    return {s["replica"] for s in r.json() if "replica" in s} if r.status_code == 200 else set()


def scrape(base: str, per_replica: bool = False) -> dict[str, float]:
    r = httpx.get(base + "/metrics", params={"per_replica": 1} if per_replica else None,
                  timeout=30)
    assert r.status_code == 200, r.text
    values = {}
    for line in r.text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            values[name] = float(value)
    return values


def per_replica(base: str, metric: str) -> dict[str, float]:
    """replica id -> that replica's value of ``metric``."""
    out = {}
    for name, value in scrape(base, per_replica=True).items():
        found = re.fullmatch(rf'llamacpp:{metric}\{{replica="([^"]+)",node="[^"]*",rank="\d+"}}',
                             name)
        if found:
            out[found.group(1)] = value
    return out


def complete_many(base: str, n: int) -> int:
    """n concurrent completions (concurrency spreads them over both replicas); the sum of their
    tokens_predicted."""
    async def run() -> list[dict]:
        async with httpx.AsyncClient(base_url=base, timeout=120) as client:
            answers = await asyncio.gather(*(client.post("/completion", json={
                "prompt": f"value_{k} = {k}\n", "n_predict": 3 + k, "temperature": 0,
                "cache_prompt": False}) for k in range(n)))
        return [a.json() for a in answers]

    return sum(a["tokens_predicted"] for a in asyncio.run(run()))


def test_metrics_are_the_sum_over_both_replicas(two):
    before = scrape(two)["llamacpp:tokens_predicted_total"]
    mine_before = per_replica(two, "tokens_predicted_total")
    predicted = complete_many(two, 12)
    # a replica too slow to answer a scrape (this machine is often loaded) counts by its last
    # report, sent once a second: past two reports that is its total too
    time.sleep(2 * REPORT_PERIOD_S + 0.5)
    for _ in range(10):  # every scrape, not only eventually
        assert scrape(two)["llamacpp:tokens_predicted_total"] - before == predicted
    mine = wait_for(lambda: (m := per_replica(two, "tokens_predicted_total")) and len(m) == 2
                    and m, 60, "both replicas in one per-replica scrape")
    gained = {r: v - mine_before.get(r, 0) for r, v in mine.items()}
    assert all(g > 0 for g in gained.values()), gained  # both replicas answered some
    assert sum(gained.values()) == predicted


def test_slots_list_both_replicas_with_global_ids(two):
    slots = httpx.get(two + "/slots", timeout=30).json()
    assert [s["id"] for s in slots] == list(range(2 * N_PARALLEL))
    by_replica: dict[str, list[int]] = {}
    for s in slots:
        assert s["node"]
        by_replica.setdefault(s["replica"], []).append(s["id"])
    # replica-major: each replica's slots are one block of consecutive ids
    assert sorted(by_replica.values()) == [[0, 1], [2, 3]]
    props = httpx.get(two + "/props", timeout=30).json()
    assert props["total_slots"] == 2 * N_PARALLEL
    assert httpx.get(two + "/slots?fail_on_no_slot=1", timeout=30).status_code == 200


def test_every_slot_id_saves_and_restores_its_own_prompt(two):
    """A global id_slot reaches its replica's slot; save, erase and restore act on that slot.
    Each slot's prompt has its own length, so a count from another slot would show."""
    with httpx.Client(base_url=two, timeout=60) as c:
        saved = {}
        for g in range(2 * N_PARALLEL):
            prompt = f"slot_{g} = {g}\n" * (g + 2)
            out = c.post("/completion", json={"prompt": prompt, "n_predict": 3, "id_slot": g,
                                              "temperature": 0}).json()
            assert out["id_slot"] == g, out
            n_prompt = len(c.post("/tokenize", json={"content": prompt,
                                                     "add_special": True}).json()["tokens"])
            slot = c.get("/slots").json()[g]
            assert (slot["id"], slot["n_prompt_tokens"]) == (g, n_prompt)
            saved[g] = c.post(f"/slots/{g}?action=save", json={"filename": f"s{g}.bin"}).json()
            assert saved[g]["id_slot"] == g and saved[g]["n_saved"] >= n_prompt, saved[g]
        assert len({s["n_saved"] for s in saved.values()}) == len(saved)
        for g, save in saved.items():
            erased = c.post(f"/slots/{g}?action=erase").json()
            assert erased == {"id_slot": g, "n_erased": save["n_saved"]}
            restored = c.post(f"/slots/{g}?action=restore", json={"filename": f"s{g}.bin"})
            assert restored.json()["n_restored"] == save["n_saved"], restored.text
            assert restored.json()["id_slot"] == g
        beyond = c.post(f"/slots/{2 * N_PARALLEL}?action=erase")
        assert (beyond.status_code, beyond.json()["error"]["message"]) == (400, "Invalid slot ID")


def test_control_finds_the_completion_on_either_replica(two):
    """POST /v1/chat/completions/control asks every replica: four armed streams at once (spread
    over both replicas by the router) each have their reasoning ended, wherever they run."""
    from tests.serve.test_control import ARMED, ended_mid_stream

    async def four() -> list:
        return await asyncio.gather(*(ended_mid_stream(two, ARMED) for _ in range(4)))

    for answer, text in asyncio.run(four()):
        assert answer == {"success": True}
        assert "</think>" in text


def test_killed_replica_does_not_lower_a_counter(two):
    import ray
    from ray.serve._private.constants import SERVE_NAMESPACE

    complete_many(two, 4)
    last = scrape(two)
    counters = [k for k in last if k.endswith("_total")]
    victim = sorted(replica_ids(two))[0]
    actor = ray.get_actor(f"SERVE_REPLICA::{APP}#ModelReplica#{victim}", namespace=SERVE_NAMESPACE)
    ray.kill(actor, no_restart=True)

    def replaced() -> bool:
        nonlocal last
        now = scrape(two)
        assert all(now[k] >= last[k] for k in counters), (last, now)
        last = now
        ids = replica_ids(two)
        return len(ids) == 2 and victim not in ids

    wait_for(replaced, 120, "the killed replica replaced", poll=0.3)
    complete_many(two, 2)
    now = scrape(two)
    assert all(now[k] >= last[k] for k in counters)


# ---- the pieces, without Ray ---------------------------------------------------------------
def test_board_keeps_the_counters_of_a_replica_that_went_away():
    from deployments.serve.status import COUNTERS, StatusBoard

    board = StatusBoard.func_or_class()
    one = dict.fromkeys(COUNTERS, 0) | {"tokens_predicted_total": 10, "n_tokens_max": 7}
    two = dict.fromkeys(COUNTERS, 0) | {"tokens_predicted_total": 5, "n_tokens_max": 9}
    totals = asyncio.run(board.count("m", {"a": one, "b": two}))
    assert (totals["tokens_predicted_total"], totals["n_tokens_max"]) == (15, 9)
    # "a" is gone, a late answer of "b" is lower than one already seen: nothing goes down
    later = asyncio.run(board.count("m", {"b": two | {"tokens_predicted_total": 4}}))
    assert later["tokens_predicted_total"] == 15
    assert asyncio.run(board.count("other", {}))["tokens_predicted_total"] == 0


def test_slot_places_follow_ranks_and_a_shared_rank_takes_the_next():
    from deployments.serve.replicas import Answer, owner, placed

    answers = placed([Answer("b", "n2", 1, None), Answer("a", "n1", 0, None),
                      Answer("c", "n1", 1, None)])
    assert [(a.replica, a.place) for a in answers] == [("a", 0), ("b", 1), ("c", 2)]
    targets = [{"replica": r, "node": "n", "rank": k} for r, k in (("x", 1), ("y", 0))]
    assert owner(targets, 3, 2) == ({"replica": "x", "node": "n"}, 1)
    assert owner(targets, 0, 2) == ({"replica": "y", "node": "n"}, 0)
    assert owner(targets, 4, 2) is None and owner(targets, -1, 2) is None


def test_combined_gauges_are_summed_and_busy_slots_averaged_over_decodes():
    from deployments.api.prometheus import combined_values

    def snap(tokens, seconds, processing):
        return {"bucket_prompt_tokens": 0, "bucket_prompt_seconds": 0.0,
                "bucket_predicted_tokens": tokens, "bucket_predicted_seconds": seconds,
                "n_processing": processing, "n_deferred": 1}

    totals = {"prompt_tokens_total": 3, "prompt_tokens_cached_total": 0,
              "prompt_seconds_total": 1.0, "tokens_predicted_total": 9,
              "tokens_predicted_seconds_total": 2.0, "n_decode_total": 4,
              "n_busy_slots_total": 6, "n_tokens_max": 5}
    values = combined_values(totals, [snap(10, 1.0, 2), snap(30, 2.0, 1)])
    assert values["predicted_tokens_seconds"] == 10 + 15
    assert (values["requests_processing"], values["requests_deferred"]) == (3, 2)
    assert values["n_busy_slots_per_decode"] == 1.5
    assert values["tokens_predicted_total"] == 9


def test_every_counter_of_an_engine_snapshot_reaches_the_summed_metrics():
    """What the ingress sums for /metrics is every total an engine snapshot carries, the
    speculative drafts' too (they were left out of the sum and always read 0)."""
    from deployments.api.prometheus import combined_values
    from deployments.serve.status import sum_counters
    from engine.tasks import EngineMetrics

    metrics = EngineMetrics(tokens_predicted_total=9, n_decode_total=3)
    metrics.spec.add(4, 3)
    snapshot = metrics.snapshot(0, 0, reset_bucket=False)
    values = combined_values(sum_counters([snapshot, snapshot]), [snapshot, snapshot])
    assert values["spec_decode_num_drafts_total"] == 2
    assert values["spec_decode_num_draft_tokens_total"] == 8
    assert values["spec_decode_num_accepted_tokens_total"] == 6
    assert values["tokens_predicted_total"] == 18
