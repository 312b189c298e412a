"""configs/sharded.yaml, then configs/cluster.yaml, on one real Ray cluster of three nodes on this
one machine (``ray.cluster_utils.Cluster``): a CPU-only head and two nodes that each advertise one
``mlx_device``, as two Macs would. Not collected by the suite (its name has no ``test_``):
tests/serve/test_multinode.py runs it in its own process, apart from the suite's one-node cluster::

    python -m pytest tests/multinode_cluster.py

The tests run in order on one cluster (one start for both configs): the sharded replica's two
ranks, one on each device node, serving; that application deleted, then configs/cluster.yaml's
placement, serving, prefix routing, a node removed while a stream runs on it, and a node added
back.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
import yaml

from tests import conftest
from tests.conftest import MODEL, free_port, wait_healthy

REPO = Path(__file__).resolve().parent.parent
CONFIG = yaml.safe_load((REPO / "configs" / "cluster.yaml").read_text())
SHARDED = yaml.safe_load((REPO / "configs" / "sharded.yaml").read_text())
DEVICE = {"mlx_device": 1}
# The ingress and shaper stay on the head here, so that removing a device node takes only model
# replicas with it (on real machines they may run anywhere: configs/cluster.yaml).
ON_HEAD = {"node:__internal_head__": 0.001}


class Scene:
    def __init__(self, cluster, device_nodes: list, base: str):
        self.cluster = cluster
        self.device_nodes = list(device_nodes)
        self.base = base

    def replicas(self) -> list[dict]:
        body = httpx.get(self.base + "/mlxray/status", timeout=30).json()
        return body["models"][0]["replicas"]

    def replica_states(self) -> dict:
        return httpx.get(self.base + "/mlxray/status", timeout=30).json()["models"][0][
            "replica_states"]


def wait_for(condition, timeout: float = 120.0, what: str = "condition"):
    return conftest.wait_for(condition, timeout, what, poll=0.5)


def cluster_config(port: int) -> dict:
    """configs/cluster.yaml as written, on this machine: the embedded model with 2 slots, two
    model replicas (the autoscaler's floor: one per device node), HTTP on a free port."""
    config = json.loads(json.dumps(CONFIG))
    config["http_options"] = {"host": "127.0.0.1", "port": port}
    config["proxy_location"] = "HeadOnly"
    app = config["applications"][0]
    app["args"].update(model=MODEL, n_parallel=2, n_ctx=8192, n_batch=64)
    for deployment in app["deployments"]:
        if deployment["name"] == "ModelReplica":
            deployment["autoscaling_config"].update(min_replicas=2, initial_replicas=2)
            assert deployment["ray_actor_options"]["resources"] == DEVICE
        else:
            deployment["ray_actor_options"]["resources"] = ON_HEAD
    return config


def start_cluster(attempts: int = 3) -> tuple:
    """A head and two device nodes; on an overloaded machine a raylet can miss Ray's fixed 30 s
    startup window, so try again (as tests/conftest.py's start_ray does)."""
    from ray.cluster_utils import Cluster

    for attempt in range(attempts):
        cluster = None
        try:
            cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 2})
            return cluster, [cluster.add_node(num_cpus=1, resources=DEVICE) for _ in range(2)]
        except Exception:
            if cluster is not None:
                cluster.shutdown()
            if attempt == attempts - 1:
                raise
    raise AssertionError("unreachable")


class DeviceNodes:
    """The three nodes and Serve on a free port (HTTP on the head only), for every config."""

    def __init__(self):
        import ray
        from ray.serve._private import api as serve_api
        from ray.serve._private.constants import SERVE_NAMESPACE

        self.cluster, self.device_nodes = start_cluster()
        try:
            ray.init(address=self.cluster.address, namespace=SERVE_NAMESPACE, log_to_driver=False)
            self.port = free_port()
            self.base = f"http://127.0.0.1:{self.port}"
            self.client = serve_api.serve_start(
                http_options={"host": "127.0.0.1", "port": self.port}, proxy_location="HeadOnly")
        except BaseException:  # a failed start leaves no node running
            ray.shutdown()
            self.cluster.shutdown()
            raise

    @contextmanager
    def serving(self, config_on_port: Callable[[int], dict]) -> Iterator[str]:
        """``config_on_port(port)`` deployed and healthy; its applications deleted after."""
        from ray import serve
        from ray.serve.schema import ServeDeploySchema

        config = config_on_port(self.port)
        assert config["proxy_location"] == "HeadOnly"
        self.client.deploy_apps(ServeDeploySchema.model_validate(config), _blocking=False)
        try:
            wait_healthy(self.base, timeout=240)
            yield self.base
        finally:
            for app in config["applications"]:
                serve.delete(app["name"])

    def shutdown(self) -> None:
        import ray
        from ray import serve

        serve.shutdown()
        ray.shutdown()
        self.cluster.shutdown()


@pytest.fixture(scope="module")
def nodes() -> Iterator[DeviceNodes]:
    cluster = DeviceNodes()
    try:
        yield cluster
    finally:
        cluster.shutdown()


def sharded_config(port: int) -> dict:
    """configs/sharded.yaml as written, on this machine: the embedded model, 2 slots, the CPU."""
    config = json.loads(json.dumps(SHARDED))
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


def test_the_ranks_land_on_the_two_device_nodes_and_serve(nodes):
    """configs/sharded.yaml: the model replica (rank 0) takes one device node's `mlx_device`;
    its placement group asks for another for rank 1, which only the other device node has."""
    from ray import serve

    with nodes.serving(sharded_config) as base:
        answer = httpx.post(base + "/completion", timeout=120, json={
            "prompt": [5, 6, 7, 8, 9, 10], "n_predict": 12, "temperature": 0,
            "ignore_eos": True, "return_tokens": True})
        assert answer.status_code == 200, answer.text
        assert len(answer.json()["tokens"]) == 12
        handle = serve.get_deployment_handle("ModelReplica", app_name="mlxray")
        state = handle.engine_state.remote().result(timeout_s=30)
        (rank,) = state["shard_states"]
        assert {state["node"], rank["node"]} == {n.node_id for n in nodes.device_nodes}
        assert rank["n_decode_total"] == state["n_decode_total"] > 0


@pytest.fixture(scope="module")
def scene(nodes: DeviceNodes) -> Iterator[Scene]:
    with nodes.serving(cluster_config) as base:
        yield Scene(nodes.cluster, nodes.device_nodes, base)


def complete(base: str, prompt: str, n_predict: int = 16) -> dict:
    answer = httpx.post(base + "/completion", timeout=120, json={
        "prompt": prompt, "n_predict": n_predict, "temperature": 0})
    assert answer.status_code == 200, answer.text
    return answer.json()


def test_one_replica_per_device_node(scene):
    replicas = wait_for(lambda: len(r := scene.replicas()) == 2 and r, what="two reports")
    device_nodes = {n.node_id for n in scene.device_nodes}
    assert {r["node"] for r in replicas} == device_nodes  # one on each, none on the head


def test_requests_are_served_by_both(scene):
    before = {r["replica"]: r["tokens_predicted_total"] for r in scene.replicas()}
    prompts = [f"def handler_{i}(request):\n" for i in range(8)]
    threads = [threading.Thread(target=complete, args=(scene.base, p, 24)) for p in prompts]
    for t in threads:
        t.start()
    for t in threads:
        t.join()

    def both_counted():
        now = {r["replica"]: r["tokens_predicted_total"] for r in scene.replicas()}
        done = sum(now.values()) - sum(before.values()) == 8 * 24
        return done and now

    now = wait_for(both_counted, what="every token in the reports")
    assert all(now[r] > before.get(r, 0) for r in now), now  # each replica's own counter


def test_prefix_routing_sends_repeats_to_the_replica_holding_the_prefix(scene):
    prompt = "import os\nimport sys\n\n\ndef main(argv):\n" * 6
    first = complete(scene.base, prompt)
    n = first["timings"]["prompt_n"] + first["timings"]["cache_n"]
    for _ in range(4):
        again = complete(scene.base, prompt)
        assert again["timings"]["cache_n"] == n - 1  # the whole prompt but its last token


def test_a_node_removed_mid_stream(scene):
    prompt = "class Parser:\n"
    frames: list = []

    def stream() -> None:
        with httpx.stream("POST", scene.base + "/completion", timeout=120, json={
                "prompt": prompt, "n_predict": 8000, "ignore_eos": True,
                "stream": True, "temperature": 0}) as answer:
            for line in answer.iter_lines():
                if line.startswith("data: "):
                    frames.append(json.loads(line[6:]))

    reader = threading.Thread(target=stream)
    reader.start()
    wait_for(lambda: len(frames) > 5, what="the stream's first frames")
    # the node whose replica reports a slot at work on the stream (8,000 tokens: seconds to go)
    # (its n_predict tells it from an earlier test's request in a report a second old)
    (busy,) = wait_for(lambda: [r for r in scene.replicas() if any(
        s["is_processing"] and (s["task"] or {}).get("n_predict") == 8000 for s in r["slots"])],
        what="the stream's replica in a report")
    (victim,) = [n for n in scene.device_nodes if n.node_id == busy["node"]]
    scene.cluster.remove_node(victim)
    reader.join(timeout=90)
    assert not reader.is_alive(), "the stream hangs after its node went away"
    # the stream had thousands of tokens to go: it ends with the error frame, not its final one
    assert "error" in frames[-1] and not frames[-1].get("stop"), frames[-1]
    survivor = next(n for n in scene.device_nodes if n is not victim)
    scene.device_nodes = [survivor]
    # new requests are answered by the survivor
    for i in range(3):
        assert complete(scene.base, f"x_{i} = ", 4)["tokens_predicted"] == 4
    replicas = wait_for(lambda: len(r := scene.replicas()) == 1 and r, what="one report")
    assert replicas[0]["node"] == survivor.node_id
    # the second replica waits for a device: no node has one free
    wait_for(lambda: (s := scene.replica_states()).get("RUNNING") == 1 and sum(s.values()) == 2,
             what="one replica running, one waiting for a device (Serve's view lags the node)")


def test_the_replica_count_comes_back_with_a_node(scene):
    added = scene.cluster.add_node(num_cpus=1, resources=DEVICE)
    scene.device_nodes.append(added)
    replicas = wait_for(lambda: len(r := scene.replicas()) == 2 and r, timeout=180,
                        what="a second replica on the new node")
    assert {r["node"] for r in replicas} == {n.node_id for n in scene.device_nodes}
    assert scene.replica_states() == {"RUNNING": 2}
    assert complete(scene.base, "def again():\n", 4)["tokens_predicted"] == 4
