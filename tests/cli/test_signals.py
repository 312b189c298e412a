"""A clean stop however the processes are signalled (issue 13): ``mlxray`` and ``make serve`` (both
through deployments/cli/launch.py), each started in a session of its own with a Ray cluster of its
own, are signalled once healthy and must exit within 30 s, leaving none of the processes they
started running. tests/processes.py knows those processes from the command's process tree, so
the other Ray clusters of the machine (other test sessions, other servers) are never looked at.

Both run as a user would start them, with Ray's token auth on (deployments/cli/ray_auth.py: the
token file made, for its owner only, here under the test's folder): Ray's GCS refuses a call
without the token and answers one with it.

CI runs two patterns: SIGTERM twice to mlxray's whole process group (systemd's stop sends the
group SIGTERM: the raylet and the GCS die with the command) and SIGINT to make serve's group
(Ctrl-C in a terminal). mlxray runs as a production line would, over HTTPS (--ssl-key-file,
--ssl-cert-file: a certificate made for the test, which the client verifies).
MLXRAY_SIGNAL_PATTERNS=all runs every command x signal x target.
"""

from __future__ import annotations

import contextlib
import datetime
import ipaddress
import os
import signal
import ssl
import stat
import sys
import time
from pathlib import Path

import httpx
import psutil
import pytest

from ..conftest import REPO, free_port
from ..processes import Launched, describe, own_cluster_env

STOP_S = 30.0
CI_PATTERNS = [("mlxray", "SIGTERM", "group", 2), ("make serve", "SIGINT", "group", 1)]
ALL_PATTERNS = [(command, sig, target, times) for command in ("mlxray", "make serve")
                for sig in ("SIGTERM", "SIGINT") for target in ("main", "group")
                for times in (1, 2)]
PATTERNS = ALL_PATTERNS if os.environ.get("MLXRAY_SIGNAL_PATTERNS") == "all" else CI_PATTERNS


def self_signed(folder: Path) -> tuple[Path, Path]:
    """A key and a certificate for 127.0.0.1, valid for a day."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName(
                [x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    key_file, cert_file = folder / "key.pem", folder / "cert.pem"
    key_file.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                           serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return key_file, cert_file


def command_line(command: str, port: int, tmp_path: Path) -> list[str]:
    if command == "mlxray":
        key, cert = self_signed(tmp_path)
        return [sys.executable, "-m", "deployments.cli.command", "-m", "models/tiny-python",
                "--port", str(port), "-np", "1", "-c", "256", "--ssl-key-file", str(key),
                "--ssl-cert-file", str(cert)]
    config = tmp_path / "local.yaml"
    config.write_text((REPO / "configs" / "local.yaml").read_text()
                      .replace("port: 8000", f"port: {port}")
                      .replace("n_parallel: 4", "n_parallel: 1"))
    return ["make", "--no-print-directory", "serve", f"CONFIG={config}"]


def wait_healthy(launched: Launched, base: str, verify: ssl.SSLContext | bool = True,
                 timeout: float = 400) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert launched.proc.poll() is None, launched.log.read_text()[-3000:]
        try:
            if httpx.get(base + "/health", timeout=5, verify=verify).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise TimeoutError(f"{base} did not become healthy")


def assert_cluster_settings(started: list[psutil.Process]) -> None:
    """The cluster's Ray workers (replicas, the HTTP proxy) run at the command's niceness, not
    Ray's +15, and the proxy calls the ingress over gRPC with gRPC's message cap: the command's
    own settings, not inherited from the test."""
    workers = {}
    for proc in started:
        with contextlib.suppress(psutil.Error):
            title = " ".join(proc.cmdline())
            if title.startswith("ray::"):
                workers[title] = proc
    assert any("ProxyActor" in title for title in workers), list(workers)
    assert any("ModelReplica" in title for title in workers), list(workers)
    own = psutil.Process().nice()  # the command inherits the test's niceness, its workers too
    for title, proc in workers.items():
        assert proc.nice() == own, title
        if "ProxyActor" in title:
            env = proc.environ()
            assert env.get("RAY_SERVE_PROXY_USE_GRPC") == "1", title
            assert env.get("RAY_SERVE_REPLICA_GRPC_MAX_MESSAGE_LENGTH") == str(2**31 - 1), title


def assert_token_auth(started: list[psutil.Process], token_file: Path) -> None:
    """The cluster runs with Ray's token auth: its token file is its owner's alone, and the
    GCS (listening on every interface: docs/deploy.md) refuses a call without the token."""
    import grpc

    assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
    bearer = [("authorization", f"Bearer {token_file.read_text()}")]
    (gcs,) = [p for p in started if "gcs_server" in " ".join(_cmdline(p))[:200]]
    ports = {c.laddr.port for c in gcs.net_connections("tcp") if c.status == psutil.CONN_LISTEN}
    answers = {}
    for port in ports:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            nodes = channel.unary_unary("/ray.rpc.NodeInfoGcsService/GetAllNodeInfo")
            try:
                nodes(b"", timeout=10)
                answers[port] = "answered without the token"
            except grpc.RpcError as exc:
                answers[port] = exc.code().name
            if answers[port] == "UNAUTHENTICATED":
                assert nodes(b"", timeout=10, metadata=bearer) is not None
    assert "UNAUTHENTICATED" in answers.values() and "answered without the token" not in \
        answers.values(), answers


def assert_only_serve_grpc_beyond_loopback(started: list[psutil.Process],
                                           token_file: Path) -> None:
    """Every listening socket of the cluster is on loopback but Serve's own gRPC server in each
    replica (Ray Serve 2.60 binds it on [::], with no setting), and each of those refuses a call
    without the token (docs/deploy.md, "Which ports open where")."""
    import grpc

    beyond, total = [], 0
    for proc in started:
        with contextlib.suppress(psutil.Error):
            for c in proc.net_connections("tcp"):
                if c.status == psutil.CONN_LISTEN:
                    total += 1
                    if not _loopback(c.laddr.ip):
                        beyond.append((" ".join(proc.cmdline())[:60], c.laddr.port))
    assert beyond and all(title.startswith("ray::ServeReplica") for title, _ in beyond), beyond
    for title, port in beyond:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            call = channel.unary_unary("/ray.serve.ASGIService/HandleRequest")
            with pytest.raises(grpc.RpcError) as refused:
                call(b"", timeout=10)
            assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED, (title, port)
    print(f"\n{total} listening sockets, {len(beyond)} beyond loopback (Serve's replica gRPC)")


def _loopback(ip: str) -> bool:
    address = ipaddress.ip_address(ip)
    mapped = getattr(address, "ipv4_mapped", None)  # ::ffff:127.0.0.1, as Ray's servers bind
    return (mapped or address).is_loopback


def _cmdline(proc: psutil.Process) -> list[str]:
    try:
        return proc.cmdline()
    except psutil.Error:
        return []


@pytest.mark.heavy
@pytest.mark.parametrize(("command", "sig", "target", "times"), PATTERNS,
                         ids=lambda v: str(v).replace(" ", "-"))
def test_the_command_stops_and_leaves_nothing_running(tmp_path, command, sig, target, times):
    port = free_port()
    # what the command must set itself (deployments/launch.CLUSTER_ENV, its auth) is not
    # inherited; the token file it makes goes under the test's folder, not ~/.ray
    token_file = tmp_path / "ray" / "auth_token"
    env = {k: v for k, v in own_cluster_env().items() if not k.startswith("RAY_AUTH")}
    launched = Launched(command_line(command, port, tmp_path), REPO,
                        {**env, "RAY_AUTH_TOKEN_PATH": str(token_file)}, tmp_path / "out.log")
    try:
        if command == "mlxray":  # HTTPS, the test's certificate trusted
            trust = ssl.create_default_context(cafile=str(tmp_path / "cert.pem"))
            wait_healthy(launched, f"https://127.0.0.1:{port}", trust)
        else:
            wait_healthy(launched, f"http://127.0.0.1:{port}")
        launched.sample()
        started = launched.alive()
        assert len(started) >= 5, describe(started)  # GCS, raylet, replicas, ...
        assert_cluster_settings(started)
        assert_token_auth(started, token_file)
        assert_only_serve_grpc_beyond_loopback(started, token_file)
        for i in range(times):
            if i:
                time.sleep(1.0)
            if launched.proc.poll() is None:
                launched.signal(getattr(signal, sig), group=target == "group")
        took = launched.wait(STOP_S)
        log = launched.log.read_text()[-3000:]
        assert took is not None, f"still running {STOP_S} s after {sig}\n{log}"
        left = launched.leftovers(grace=1.0)
        assert not left, f"left running: {describe(left)}\n{log}"
        if command == "mlxray":
            assert launched.proc.returncode == 0, log
        print(f"\n{command} {sig} x{times} to the {target}: exited after {took:.1f} s, "
              f"{len(started)} processes started, none left")
    finally:
        launched.kill_all()
        launched.close()


@pytest.mark.parametrize("sig", ["SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT"])
def test_every_stop_signal_asks_for_a_stop_then_for_it_at_once(sig):
    """SIGHUP (a closed terminal) and SIGQUIT stop the launcher as SIGTERM does: the handler the
    launcher installs, signalled in this process (the full command runs above for SIGTERM)."""
    from deployments.cli.launch import Signals

    number = getattr(signal, sig)
    before = signal.getsignal(number)
    signals = Signals()
    try:
        signals.install()
        os.kill(os.getpid(), number)
        assert signals.stop.wait(5) and not signals.hurry.is_set()
        os.kill(os.getpid(), number)
        assert signals.hurry.wait(5)
    finally:
        signal.signal(number, before)


def test_its_own_cluster_is_asked_for_loopback_and_no_dashboard(monkeypatch):
    """What the launcher asks Ray for when it starts a cluster of its own (issue #28; what Ray
    still binds on every interface is in docs/deploy.md): joining RAY_ADDRESS asks nothing."""
    import ray

    from deployments.cli import launch

    asked: list[dict] = []
    monkeypatch.setattr(ray, "init", lambda **kw: asked.append(kw))
    monkeypatch.setattr(launch.Signals, "install", lambda self: None)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.delenv("MLXRAY_NODE_IP", raising=False)
    monkeypatch.delenv("MLXRAY_DASHBOARD", raising=False)
    launch._init_ray(launch.Signals())
    assert asked[-1]["_node_ip_address"] == "127.0.0.1"
    assert asked[-1]["include_dashboard"] is False
    monkeypatch.setenv("RAY_ADDRESS", "ray://head:10001")
    launch._init_ray(launch.Signals())
    assert "_node_ip_address" not in asked[-1] and "include_dashboard" not in asked[-1]


def test_its_own_cluster_is_set_up_for_token_auth_and_loopback(monkeypatch, tmp_path):
    """Before Ray is imported: token auth, and Ray told to keep a loopback node address on
    loopback (on Linux it would resolve 127.0.0.1 to the machine's address); a node address
    the user names is left to Ray."""
    from deployments.cli import launch

    for name in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "MLXRAY_NODE_IP",
                 "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("RAY_AUTH_TOKEN_PATH", str(tmp_path / "token"))
    launch.own_cluster_setup()
    assert os.environ["RAY_AUTH_MODE"] == "token" and (tmp_path / "token").exists()
    assert os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] == "0"
    monkeypatch.delenv("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER")
    monkeypatch.setenv("MLXRAY_NODE_IP", "10.0.0.5")
    launch.own_cluster_setup()
    assert "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER" not in os.environ
