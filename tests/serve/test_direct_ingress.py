"""The command's port served by the ingress replica itself (deployments/serve/direct_ingress.py):
which
configs get it, and an ``mlxray`` process serving that way. Its port is the Ingress replica's own
socket, Serve's proxy (moved to a port of its own) gives the same answers, a client that goes
away frees its slot, and an Ingress replica killed is replaced on the same port. With
``--serve-proxy`` the port is the proxy's, as before (that run also checks ``--api-key``)."""

from __future__ import annotations

import asyncio
import re
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator

import httpx
import psutil
import pytest

from deployments.serve import direct_ingress

from ..cli.test_signals import wait_healthy
from ..conftest import REPO, free_port, wait_for
from ..processes import Launched, describe, own_cluster_env
from .test_transport import answers

ONE_APP = {"http_options": {"host": "127.0.0.1", "port": 8123},
           "applications": [{"name": "mlxray", "import_path": "deployments.serve.graph:build_app",
                             "deployments": [{"name": "Ingress"}]}]}


def test_one_application_is_served_by_its_ingress(monkeypatch):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    served = direct_ingress.plan(ONE_APP)
    assert served.direct and served.reason == ""
    assert served.env["RAY_SERVE_ENABLE_DIRECT_INGRESS"] == "1"
    # Serve's port range is [min, max): exactly the command's port
    assert (served.env["RAY_SERVE_DIRECT_INGRESS_MIN_HTTP_PORT"],
            served.env["RAY_SERVE_DIRECT_INGRESS_MAX_HTTP_PORT"]) == ("8123", "8124")
    assert served.env["RAY_SERVE_PORT_QUARANTINE_S"] == "0"
    proxy_port = served.config["http_options"]["port"]
    assert proxy_port != 8123 and ONE_APP["http_options"]["port"] == 8123  # a copy was moved
    assert served.config["applications"] == ONE_APP["applications"]


@pytest.mark.parametrize(("change", "reason"), [
    ({"serve_proxy": True}, "--serve-proxy"),
    ({"RAY_ADDRESS": "ray://elsewhere:10001"}, "RAY_ADDRESS"),
    ({"proxy_location": "Disabled"}, "proxy_location"),
    ({"apps": 2}, "2 applications"),
    ({"ingress": {"num_replicas": 2}}, "an ingress of 2 replicas"),
    ({"ingress": {"autoscaling_config": {"max_replicas": 4}}}, "an autoscaled ingress"),
])
def test_the_proxy_stays_in_front_when_it_must(monkeypatch, change, reason):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    config = {**ONE_APP, "applications": [dict(ONE_APP["applications"][0])]}
    if "RAY_ADDRESS" in change:
        monkeypatch.setenv("RAY_ADDRESS", change["RAY_ADDRESS"])
    if "proxy_location" in change:
        config["proxy_location"] = change["proxy_location"]
    if "apps" in change:
        config["applications"] = config["applications"] * change["apps"]
    if "ingress" in change:
        config["applications"][0]["deployments"] = [{"name": "Ingress", **change["ingress"]}]
    served = direct_ingress.plan(config, change.get("serve_proxy", False))
    assert not served.direct and served.env == {}
    assert reason in served.reason
    assert served.config is config


def test_a_port_in_use_is_refused_before_any_cluster_starts(tmp_path):
    """llama-server's own message, at once; nothing of Ray is started (the command would
    otherwise wait on Serve retrying its server on the port)."""
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        done = subprocess.run([sys.executable, "-m", "deployments.cli.command",
                               "-m", "models/tiny-python", "--port", str(port)],
                              cwd=REPO, env=own_cluster_env(), capture_output=True,
                              text=True, timeout=120)
    assert done.returncode == 1
    assert f"couldn't bind HTTP server socket, hostname: 127.0.0.1, port: {port}" in done.stderr
    assert "Started a local Ray instance" not in done.stderr + done.stdout


def test_a_port_held_by_closing_connections_is_not_taken():
    """A server that closed a connection first leaves it in TIME_WAIT on its port for up to a
    minute; the proxy and the ingress bind with SO_REUSEADDR, so the port can be served."""
    with socket.socket() as server:
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        config = {"http_options": {"host": "127.0.0.1", "port": port}}
        assert direct_ingress.port_taken(config).startswith("couldn't bind HTTP server socket")
        with socket.create_connection(("127.0.0.1", port)) as client:
            accepted, _ = server.accept()
            accepted.close()  # the server's side closes first: its end waits in TIME_WAIT
            client.recv(1)
    with socket.socket() as plain:  # as Serve 2.60 binds an ingress replica's socket itself
        with pytest.raises(OSError):
            plain.bind(("127.0.0.1", port))
    assert direct_ingress.port_taken(config) == ""


# ---- an mlxray process --------------------------------------------------------------------
def listening(launched: Launched, port: int) -> list[psutil.Process]:
    """The command's processes listening on ``port`` (its own process tree: psutil's system-wide
    table needs root on macOS)."""
    launched.sample()
    found = []
    for proc in launched.alive():
        try:
            if any(c.status == psutil.CONN_LISTEN and c.laddr.port == port
                   for c in proc.net_connections("tcp")):
                found.append(proc)
        except psutil.Error:
            continue
    return found


def listener(launched: Launched, port: int) -> str:
    """The command line of the command's process listening on ``port``."""
    procs = listening(launched, port)
    assert len(procs) == 1, describe(procs)
    return " ".join(procs[0].cmdline())


def start(tmp_path, *flags: str) -> tuple[Launched, str, str]:
    """``mlxray`` in a session of its own: (process, its base URL, the proxy's base URL)."""
    port = free_port()
    argv = [sys.executable, "-m", "deployments.cli.command", "-m", "models/tiny-python", "--port",
            str(port), "-np", "1", "-c", "16384", *flags]
    launched = Launched(argv, REPO, own_cluster_env(), tmp_path / "mlxray.log")
    base = f"http://127.0.0.1:{port}"
    wait_healthy(launched, base)
    line = wait_for(lambda: re.search(r"mlxray: serving on (\S+) \((.*)\)",
                                      launched.log.read_text()), timeout=60,
                    what="the command's announcement")
    proxy = re.search(r"proxy is on port (\d+)", line.group(2))
    return launched, base, f"http://127.0.0.1:{proxy.group(1)}" if proxy else base


def stop(launched: Launched) -> None:
    launched.signal(signal.SIGTERM, group=True)
    exited = launched.wait(30)
    left = launched.leftovers(5)
    launched.kill_all()
    launched.close()
    assert exited is not None and not left, describe(left)


@pytest.fixture(scope="module")
def direct(tmp_path_factory) -> Iterator[tuple[Launched, str, str]]:
    launched, base, proxy = start(tmp_path_factory.mktemp("direct"))
    try:
        yield launched, base, proxy
    finally:
        stop(launched)


@pytest.mark.heavy
def test_the_port_is_the_ingress_replicas_and_answers_as_the_proxy(direct):
    launched, base, proxy = direct
    port, proxy_port = int(base.rsplit(":", 1)[1]), int(proxy.rsplit(":", 1)[1])
    assert "ServeReplica:mlxray:Ingress" in listener(launched, port)
    assert "ProxyActor" in listener(launched, proxy_port)
    assert answers(base) == answers(proxy)
    headers = httpx.post(base + "/completion", json={"prompt": "x", "n_predict": 2,
                                                     "stream": True}).headers
    assert headers["content-type"].startswith("text/event-stream")
    assert headers["x-accel-buffering"] == "no"


def slot_busy(base: str) -> bool:
    return any(s["is_processing"] for s in httpx.get(base + "/slots", timeout=10).json())


@pytest.mark.heavy
def test_a_client_gone_frees_its_slot(direct):
    """The stream would run to the slot's 16,384-token context (about a minute here): the slot is
    free again within seconds of the client leaving."""
    _, base, _ = direct
    endless = {"prompt": [5, 6, 7], "n_predict": 100000, "ignore_eos": True, "stream": True}

    async def read_a_little_and_leave():
        async with httpx.AsyncClient(base_url=base, timeout=60) as client:
            async with client.stream("POST", "/completion", json=endless) as r:
                async for _ in r.aiter_bytes():
                    assert slot_busy(base)
                    break

    asyncio.run(read_a_little_and_leave())
    wait_for(lambda: not slot_busy(base), timeout=10, what="the slot freed")


@pytest.mark.heavy
def test_a_killed_ingress_is_replaced_on_the_same_port(direct):
    """Killed while a client keeps a connection open, which then lingers on the port: the
    replacement binds it all the same (direct_ingress.reclaimable_port)."""
    launched, base, _ = direct
    port = int(base.rsplit(":", 1)[1])
    (ingress,) = listening(launched, port)
    kept = httpx.Client(base_url=base)
    assert kept.get("/health").status_code == 200  # the connection stays open
    ingress.kill()
    wait_for(lambda: [p for p in listening(launched, port) if p.pid != ingress.pid],
             timeout=120, what="a new Ingress replica on the port")
    wait_healthy(launched, base, timeout=120)
    assert "ServeReplica:mlxray:Ingress" in listener(launched, port)
    assert answers(base)[4] == 400
    kept.close()


@pytest.mark.heavy
def test_serve_proxy_keeps_the_proxy_on_the_port_and_the_key_is_enforced(tmp_path):
    """Also the API-key issue's acceptance command (``-np 2 --api-key k``): one start serves
    both checks."""
    launched, base, proxy = start(tmp_path, "--serve-proxy", "-np", "2", "--api-key", "k")
    try:
        assert proxy == base
        assert "ProxyActor" in listener(launched, int(base.rsplit(":", 1)[1]))
        assert "through Ray Serve's proxy: --serve-proxy" in launched.log.read_text()
        body = {"prompt": "def main():\n", "n_predict": 4, "temperature": 0}
        assert httpx.post(base + "/completion", json=body).status_code == 401
        key = {"Authorization": "Bearer k"}
        ok = httpx.post(base + "/completion", json=body, headers=key, timeout=60)
        assert ok.status_code == 200 and ok.json()["tokens_predicted"] == 4
        too_many = httpx.post(base + "/completion", json={**body, "n_cmpl": 3}, headers=key)
        assert "1 <= value <= 2" in too_many.json()["error"]["message"]
    finally:
        stop(launched)
