"""A two-node Ray cluster with token auth, started as docs/deploy.md says (``ray start --head``
and ``ray start --address`` with ``RAY_AUTH_MODE=token`` and the token file), here both on this
machine: the second node joins with the token; calls to the head's GCS and the second node's
raylet without the token, or with a wrong one, are refused, and a Ray driver that has it
connects, sees both nodes and runs a task on the second."""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from ..conftest import REPO, free_port
from ..processes import Launched, describe, own_cluster_env

RAY = str(Path(sys.executable).parent / "ray")
STARTED = "Ray runtime started"
DRIVER = """
import ray
ray.init(address="{address}", log_to_driver=False)
alive = [n for n in ray.nodes() if n["Alive"]]
on_second = ray.remote(lambda: "ran").options(resources={{"second": 1}}).remote()
print("nodes", len(alive), ray.get(on_second, timeout=60))
"""


def ray_start(args: list[str], env: dict, folder: Path, name: str) -> Launched:
    """``ray start ... --block`` in a session of its own, up once it says so."""
    node = Launched([RAY, "start", *args, "--num-cpus=1", "--block", "--disable-usage-stats",
                     f"--dashboard-agent-listen-port={free_port()}"], REPO, env,
                    folder / f"{name}.log")
    deadline = time.monotonic() + 60
    while STARTED not in node.log.read_text(errors="replace"):
        assert node.proc.poll() is None and time.monotonic() < deadline, \
            node.log.read_text(errors="replace")[-3000:]
        time.sleep(0.3)
    return node


def listening(node: Launched, binary: str) -> set[int]:
    node.sample()
    return {c.laddr.port for p in node.alive() if binary in " ".join(p.cmdline())[:300]
            for c in p.net_connections("tcp") if c.status == psutil.CONN_LISTEN}


def answer(port: int, method: str, token: str | None) -> str:
    import grpc

    metadata = [("authorization", f"Bearer {token}")] if token else None
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        try:
            channel.unary_unary(method)(b"", timeout=10, metadata=metadata)
            return "OK"
        except grpc.RpcError as exc:
            return exc.code().name


def _lines(proc: subprocess.Popen, until: str, timeout: float) -> Iterator[str]:
    """``proc``'s output lines up to the first that holds ``until`` (or its end)."""
    deadline = time.monotonic() + timeout
    for line in proc.stdout:
        yield line
        if until in line or time.monotonic() > deadline:
            return


@pytest.fixture(scope="module")
def cluster() -> Iterator[tuple[Launched, Launched, str, str, dict]]:
    folder = Path(tempfile.mkdtemp(prefix="rtauth", dir="/tmp"))  # Ray's socket paths are short
    token_file = folder / "auth_token"
    token = secrets.token_hex(32)
    token_file.write_text(token)
    token_file.chmod(0o600)
    env = {k: v for k, v in own_cluster_env().items() if not k.startswith("RAY_AUTH")}
    env |= {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(token_file), "HOME": str(folder)}
    port = free_port()
    started: list[Launched] = []
    try:
        started.append(ray_start(["--head", f"--port={port}", "--include-dashboard=false",
                                  f"--ray-client-server-port={free_port()}",
                                  f"--temp-dir={folder / 'ray'}"], env, folder, "head"))
        started.append(ray_start([f"--address=127.0.0.1:{port}", '--resources={"second": 1}'],
                                 env, folder, "node"))
        yield started[0], started[1], f"127.0.0.1:{port}", token, env
    finally:
        for node in reversed(started):  # ray start --block stops its processes on SIGTERM,
            node.signal(signal.SIGTERM, group=True)  # not always within seconds: then SIGKILL
        for node in started:
            node.leftovers(grace=3)
            node.kill_all()
            node.close()
        left = [p for node in started for p in node.alive()]
        shutil.rmtree(folder, ignore_errors=True)
        assert not left, f"left running: {describe(left)}"


@pytest.mark.heavy
def test_without_the_token_the_cluster_refuses_and_with_it_a_driver_connects(cluster):
    head, node, address, token, env = cluster
    (gcs,) = listening(head, "gcs_server") & {int(address.rsplit(":", 1)[1])}
    nodes = "/ray.rpc.NodeInfoGcsService/GetAllNodeInfo"
    assert answer(gcs, nodes, None) == "UNAUTHENTICATED"
    assert answer(gcs, nodes, "0" * 64) == "UNAUTHENTICATED"
    assert answer(gcs, nodes, token) == "OK"
    # the second node's raylet (its node manager among its ports) refuses the same way
    stats = {port: answer(port, "/ray.rpc.NodeManagerService/GetNodeStats", None)
             for port in listening(node, "raylet")}
    assert "UNAUTHENTICATED" in stats.values() and "OK" not in stats.values(), stats
    driver = subprocess.run([sys.executable, "-c", DRIVER.format(address=address)], cwd=REPO,
                            env=env, capture_output=True, text=True, timeout=120)
    assert driver.returncode == 0, driver.stderr[-3000:]
    assert driver.stdout.split()[-3:] == ["nodes", "2", "ran"], driver.stdout
    # a Ray driver without the token (auth off on its side, no token file): the GCS answers
    # its first call Unauthenticated (Ray retries for 20 s before giving up: it is stopped)
    stranger = {k: v for k, v in env.items() if not k.startswith("RAY_AUTH")}
    stranger["RAY_AUTH_MODE"] = "disabled"
    refused = subprocess.Popen([sys.executable, "-c", DRIVER.format(address=address)],
                               cwd=REPO, env=stranger, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True)
    try:
        heard = [line for line in _lines(refused, until="Unauthenticated", timeout=60)]
    finally:
        refused.kill()
        refused.wait(10)
    assert "Unauthenticated" in heard[-1] and not any(h.startswith("nodes") for h in heard), heard
    assert os.stat(env["RAY_AUTH_TOKEN_PATH"]).st_mode & 0o077 == 0
