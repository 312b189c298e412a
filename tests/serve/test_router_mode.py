"""Router mode (``mlxray --models-dir DIR``) on real Ray Serve with real tiny models: models load
on demand, ``--models-max`` unloads the least recently used idle one (its memory freed), the
routes, statuses, errors and SSE events of llama-server's router, and sleep after idle."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from deployments.cli import command as cli
from tests.conftest import MODEL
from tests.gguf_files import REFERENCE_GGUF
from tests.reliability import dedicated_app

APP, SLEEPY = "router", "routersleep"
CPU = {"ray_actor_options": {"num_cpus": 0.25}}
WEIGHTS_BYTES = (Path(MODEL) / "model.safetensors").stat().st_size


def folder(root: Path, *names: str) -> Path:
    """``root`` with the tiny mlx-lm model under each name (``.gguf``: the same weights' file)."""
    for name in names:
        if name.endswith(".gguf"):
            (root / name).symlink_to(REFERENCE_GGUF)
        else:
            (root / name).symlink_to(Path(MODEL).resolve(), target_is_directory=True)
    return root


def app_args(root: Path, *flags: str) -> dict:
    argv = ["--models-dir", str(root), "-c", "512", "-np", "1", *flags]
    return cli.serve_config(cli.parse(argv, {}))["applications"][0]["args"]


def statuses(client: httpx.Client) -> dict[str, str]:
    return {m["id"]: m["status"]["value"] for m in client.get("/models").json()["data"]}


def wait_for(client: httpx.Client, name: str, status: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while statuses(client)[name] != status:
        assert time.monotonic() < deadline, f"{name} never became {status}: {statuses(client)}"
        time.sleep(0.1)


def replica(app: str, name: str):
    from ray import serve

    return serve.get_deployment_handle(f"ModelReplica:{name}", app)


def replica_state(app: str, name: str) -> dict:
    return replica(app, name).state.remote().result()


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


def complete(client: httpx.Client, model: str, path: str = "/completion") -> httpx.Response:
    return client.post(path, json={"prompt": "def f():", "n_predict": 2, "model": model})


@pytest.fixture(scope="module")
def router(serve_instance: int, tmp_path_factory: pytest.TempPathFactory
           ) -> Iterator[httpx.Client]:
    root = folder(tmp_path_factory.mktemp("router"), "tiny-a", "small.gguf")
    with dedicated_app(serve_instance, APP, app_args(root, "--models-max", "1"), CPU) as base:
        with httpx.Client(base_url=base, timeout=120) as client:
            yield client


class Events:
    """``GET /models/sse``'s events, read on a thread of their own."""

    def __init__(self, client: httpx.Client):
        self.items: list[dict] = []
        self.timed: list[tuple[float, dict]] = []
        self._open = threading.Event()
        self._thread = threading.Thread(target=self._read, args=(client,), daemon=True)
        self._thread.start()
        assert self._open.wait(30)

    def _read(self, client: httpx.Client) -> None:
        with client.stream("GET", "/models/sse", timeout=None) as answer:
            assert answer.headers["content-type"].startswith("text/event-stream")
            self._open.set()
            for line in answer.iter_lines():
                if line.startswith("data: "):
                    self.items.append(json.loads(line[6:]))
                    self.timed.append((time.monotonic(), self.items[-1]))

    def sequence(self, model: str) -> list[str]:
        return [e["data"]["status"] for e in self.items if e["model"] == model]


def test_router_props_and_the_routers_errors(router):
    props = router.get("/props").json()
    assert (props["role"], props["max_instances"], props["models_autoload"],
            props["model_alias"], props["model_path"]) == ("router", 1, True, "llama-server",
                                                           "none")
    assert statuses(router) == {"small": "unloaded", "tiny-a": "unloaded"}
    errors = [
        (complete(router, ""), 400, "model name is missing from the request"),
        (complete(router, "nope"), 400, "model 'nope' not found"),
        (router.post("/completion?autoload=false", json={"prompt": "x", "model": "small"}),
         400, "model is not loaded"),
        (router.post("/models/load", json={"model": "nope"}), 404, "model is not found"),
        (router.post("/models/unload", json={"model": "nope"}), 400, "model is not found"),
        (router.post("/models/unload", json={"model": "small"}), 400, "model is not running"),
    ]
    for answer, status, message in errors:
        assert (answer.status_code, answer.json()["error"]["message"]) == (status, message)
    assert statuses(router) == {"small": "unloaded", "tiny-a": "unloaded"}  # nothing loaded


def test_a_request_loads_its_model_and_the_next_model_unloads_it(router):
    events = Events(router)
    answer = complete(router, "tiny-a")  # autoload: waits for the load, then answers
    assert answer.status_code == 200, answer.text
    assert statuses(router) == {"small": "unloaded", "tiny-a": "loaded"}
    loaded = replica_state(APP, "tiny-a")
    assert loaded["memory_bytes"] > 1_000_000  # the weights (3 MB) are in memory
    assert router.post("/models/load", json={"model": "tiny-a"}).json()["error"]["message"] == (
        "model is already running")

    answer = router.post("/v1/chat/completions", json={
        "model": "small", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]})
    assert answer.status_code == 200, answer.text
    assert statuses(router) == {"small": "loaded", "tiny-a": "unloaded"}  # --models-max 1
    assert replica_state(APP, "tiny-a")["memory_bytes"] < loaded["memory_bytes"] / 10

    entry = {m["id"]: m for m in router.get("/models").json()["data"]}["small"]
    assert list(entry) == ["id", "aliases", "tags", "object", "owned_by", "created", "status",
                           "architecture", "source", "can_remove", "meta"]
    deadline = time.monotonic() + 10
    while len(events.sequence("small")) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert events.sequence("tiny-a") == ["loading", "loaded", "unloaded"]
    assert events.sequence("small") == ["loading", "loaded"]
    kinds = [(e["model"], e["event"]) for e in events.items]
    assert kinds[:2] == [("tiny-a", "model_status"), ("tiny-a", "status_change")]
    unloaded = [e for e in events.items if e["data"]["status"] == "unloaded"][0]
    assert unloaded["data"]["exit_code"] == 0


def test_a_busy_model_is_not_the_one_unloaded(router):
    """A request holds its model until its answer is sent: the request for the other model
    waits for it, and then unloads it."""
    events = Events(router)
    long: list[tuple[httpx.Response, float]] = []

    def generate() -> None:
        answer = router.post("/completion", json={
            "prompt": "def f():", "n_predict": 300, "ignore_eos": True, "model": "small"})
        long.append((answer, time.monotonic()))

    first = threading.Thread(target=generate)
    first.start()
    while statuses(router)["small"] != "loaded":
        time.sleep(0.01)
    time.sleep(0.1)
    assert complete(router, "tiny-a").status_code == 200
    first.join(60)
    answer, ended = long[0]
    assert answer.status_code == 200 and answer.json()["tokens_predicted"] == 300, answer.text
    assert statuses(router) == {"small": "unloaded", "tiny-a": "loaded"}
    unloaded = [t for t, e in events.timed if e["model"] == "small"
                and e["data"]["status"] == "unloaded"]
    assert unloaded and unloaded[0] >= ended - 0.05  # unloaded once its answer was out


def test_twenty_load_and_unload_cycles_leak_nothing(router):
    if statuses(router)["tiny-a"] == "loaded":
        assert router.post("/models/unload", json={"model": "tiny-a"}).json() == {
            "success": True}
        wait_for(router, "tiny-a", "unloaded")
    pid = replica_state(APP, "small")["pid"]
    sizes = []
    for _ in range(20):
        assert router.post("/models/load", json={"model": "small"}).json() == {"success": True}
        wait_for(router, "small", "loaded")
        assert complete(router, "small").status_code == 200
        router.post("/models/unload", json={"model": "small"})
        wait_for(router, "small", "unloaded")
        sizes.append(rss_kib(pid))
    assert replica_state(APP, "small")["loads"] >= 20
    # after the first few (allocator warm-up) the process does not grow with each cycle
    assert sizes[-1] - sizes[4] < 20_000, sizes


@pytest.fixture(scope="module")
def sleepy(serve_instance: int, tmp_path_factory: pytest.TempPathFactory
           ) -> Iterator[httpx.Client]:
    root = folder(tmp_path_factory.mktemp("sleepy"), "tiny-a", "tiny-b")
    args = app_args(root, "--models-max", "0", "--sleep-idle-seconds", "1", "--metrics")
    with dedicated_app(serve_instance, SLEEPY, args, CPU) as base:
        with httpx.Client(base_url=base, timeout=120) as client:
            yield client


def test_each_model_has_its_own_replica_and_requests_reach_it(sleepy):
    assert complete(sleepy, "tiny-a").status_code == 200
    a, b = replica_state(SLEEPY, "tiny-a"), replica_state(SLEEPY, "tiny-b")
    assert (a["loads"], b["loads"], b["status"]) == (1, 0, "unloaded")
    assert complete(sleepy, "tiny-b").status_code == 200
    a2, b2 = replica_state(SLEEPY, "tiny-a"), replica_state(SLEEPY, "tiny-b")
    assert (a2["loads"], b2["loads"]) == (1, 1) and a2["pid"] != b2["pid"]


def test_an_idle_model_sleeps_and_the_next_request_wakes_it(sleepy):
    assert complete(sleepy, "tiny-a").status_code == 200
    wait_for(sleepy, "tiny-a", "sleeping", timeout=20)
    # the weights are gone: the unload freed at least their size (measured in the replica, not
    # the process's whole MLX memory, which in the full suite has held 3.8 MB besides)
    asleep = replica_state(SLEEPY, "tiny-a")
    assert asleep["freed_bytes"] >= WEIGHTS_BYTES, asleep
    assert sleepy.get("/props?model=tiny-a").json()["is_sleeping"] is True
    assert sleepy.get("/health").status_code == 200
    assert sleepy.get("/metrics?model=tiny-a").status_code == 200
    assert replica_state(SLEEPY, "tiny-a")["status"] == "sleeping"  # none of them woke it
    assert statuses(sleepy)["tiny-a"] == "sleeping"
    loads = replica_state(SLEEPY, "tiny-a")["loads"]
    assert complete(sleepy, "tiny-a").status_code == 200  # waits for the load
    assert statuses(sleepy)["tiny-a"] == "loaded"  # at once, not at the router's next look
    assert replica_state(SLEEPY, "tiny-a")["loads"] == loads + 1


def test_the_router_flags_and_their_variables_reach_the_config(tmp_path):
    root = folder(tmp_path, "tiny-a")
    args = app_args(root, "--models-max", "2", "--no-models-autoload",
                    "--sleep-idle-seconds", "30")
    assert (args["models_max"], args["models_autoload"], args["sleep_idle_seconds"]) == (
        2, False, 30)
    environ = {"LLAMA_ARG_MODELS_DIR": str(root), "LLAMA_ARG_MODELS_MAX": "0",
               "LLAMA_ARG_MODELS_AUTOLOAD": "0"}
    args = cli.serve_config(cli.parse([], environ))["applications"][0]["args"]
    assert (args["models_max"], args["models_autoload"]) == (0, False)
    assert app_args(root, "--models-autoload").get("models_autoload", True) is True
    with pytest.raises(cli.Refused, match="cannot be 0 or less than -1"):
        cli.parse(["--models-dir", str(root), "--sleep-idle-seconds", "0"], {})


def test_a_single_model_sleeps_as_the_references_test_sleep_says():
    """llama.cpp's test_sleep.py on one model (-m, in-process graph): /health, /props, /models
    and /metrics answer while it sleeps without waking it; a completion wakes it."""
    from tests.local_graph import local_graph_parts

    with local_graph_parts({"sleep_idle_seconds": 1, "metrics": True, "n_ctx": 128,
                            "n_parallel": 1}) as (client, model):
        deadline = time.monotonic() + 20
        while model.residency.status != "sleeping":  # the first /props comes while it sleeps
            assert time.monotonic() < deadline, "the model never slept"
            time.sleep(0.1)
        assert model.engine is None
        assert client.get("/props").json()["is_sleeping"] is True
        for path in ("/health", "/props", "/models", "/metrics"):
            assert client.get(path).status_code == 200, path
        assert model.residency.status == "sleeping"
        answer = client.post("/completion", json={"prompt": "def f():", "n_predict": 2})
        assert answer.status_code == 200, answer.text
        assert client.get("/props").json()["is_sleeping"] is False
        assert model.residency.loads == 2
