"""configs/sharded.yaml on a Ray cluster of three nodes on this one machine
(``ray.cluster_utils.Cluster``): a CPU-only head and two nodes that each advertise one
``mlx_device``, as two Macs would. Not collected by the suite (its name has no ``test_``):
tests/serve/test_sharded.py runs it in its own process, apart from the suite's one-node cluster::

    python -m pytest tests/sharded_cluster.py

The model replica (rank 0) takes one device node's `mlx_device`; its placement group asks for
another for rank 1, which only the other device node has.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml

from tests.conftest import MODEL
from tests.multinode_cluster import DEVICE, ON_HEAD, serving

REPO = Path(__file__).resolve().parent.parent
CONFIG = yaml.safe_load((REPO / "configs" / "sharded.yaml").read_text())


def sharded_config(port: int) -> dict:
    """configs/sharded.yaml as written, on this machine: the embedded model, 2 slots, the CPU."""
    config = json.loads(json.dumps(CONFIG))
    config["http_options"] = {"host": "127.0.0.1", "port": port}
    app = config["applications"][0]
    app["args"].update(model=MODEL, n_parallel=2, n_ctx=2048, n_batch=64, device="cpu")
    for deployment in app["deployments"]:
        if deployment["name"] == "ModelReplica":
            assert deployment["ray_actor_options"]["resources"] == DEVICE
            assert app["args"]["shards"] == 2
        else:
            deployment["ray_actor_options"]["resources"] = ON_HEAD
    return config


@pytest.fixture(scope="module")
def scene() -> Iterator[tuple[list, str]]:
    with serving(sharded_config) as (_, nodes, base):
        yield nodes, base


def test_the_ranks_land_on_the_two_device_nodes_and_serve(scene):
    from ray import serve

    nodes, base = scene
    answer = httpx.post(base + "/completion", timeout=120, json={
        "prompt": [5, 6, 7, 8, 9, 10], "n_predict": 12, "temperature": 0, "ignore_eos": True,
        "return_tokens": True})
    assert answer.status_code == 200, answer.text
    assert len(answer.json()["tokens"]) == 12
    handle = serve.get_deployment_handle("ModelReplica", app_name="mlxray")
    state = handle.engine_state.remote().result(timeout_s=30)
    (rank,) = state["shard_states"]
    assert {state["node"], rank["node"]} == {n.node_id for n in nodes}  # one rank each
    assert rank["n_decode_total"] == state["n_decode_total"] > 0
