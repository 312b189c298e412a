"""HTTP served by the ingress replica itself (Ray Serve's direct ingress) on the command's port.

Through Ray Serve's HTTP proxy a request costs two more Ray messages on the first token's way
(proxy -> ingress, then the ingress fetching the body back from the proxy) and one more per
streamed item (docs/performance.md, "Where the cost is"). With ``RAY_SERVE_ENABLE_DIRECT_INGRESS``
the ingress replica runs its own uvicorn server on a port Serve hands out from a range; making
that range the command's one port puts the client straight on the ingress. Serve still starts
its proxy on the head node (it will not serve direct ingress without one): it moves to a free
port of its own.

One ingress replica can have one port, so this applies only to a cluster the command starts
itself, with a single application whose ingress is not scaled out (``mlxray`` and the shipped
``configs/local.yaml`` are). Everything else, and ``--serve-proxy``, keeps the proxy in front.
An Ingress replica binds the port as the proxy does (``reclaimable_port``), so one that dies is
replaced on the same port.
"""

from __future__ import annotations

import copy
import os
import socket
from dataclasses import dataclass, field
from typing import Any

INGRESS_NAME = "Ingress"


@dataclass
class Plan:
    """The config to deploy and the variables the cluster must start with."""

    config: dict[str, Any]
    env: dict[str, str] = field(default_factory=dict)
    reason: str = ""  # why the proxy stays in front, when it does

    @property
    def direct(self) -> bool:
        return bool(self.env)


def plan(config: dict[str, Any], serve_proxy: bool = False) -> Plan:
    """Serve ``config``'s port from its ingress replica when it can be; else the config as is."""
    reason = _proxy_reason(config, serve_proxy)
    if reason:
        return Plan(config, reason=reason)
    http = config.get("http_options") or {}
    port = int(http.get("port", 8000))
    env = {"RAY_SERVE_ENABLE_DIRECT_INGRESS": "1",
           # Serve's range is [min, max): the one port
           "RAY_SERVE_DIRECT_INGRESS_MIN_HTTP_PORT": str(port),
           "RAY_SERVE_DIRECT_INGRESS_MAX_HTTP_PORT": str(port + 1),
           # Serve holds a stopping ingress for 30 s, and a freed port out of use for 150 s,
           # so that a load balancer in front notices; with none, a replacement ingress (after
           # a crash) would find its only port quarantined
           "RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S": "0",
           "RAY_SERVE_PORT_QUARANTINE_S": "0"}
    moved = copy.deepcopy(config)
    moved.setdefault("http_options", {})["port"] = _free_port()
    return Plan(moved, env)


def _proxy_reason(config: dict[str, Any], serve_proxy: bool) -> str:
    if serve_proxy:
        return "--serve-proxy"
    if os.environ.get("RAY_ADDRESS"):
        return "a cluster the command joins (RAY_ADDRESS)"
    if config.get("proxy_location") == "Disabled":
        return "proxy_location: Disabled"
    apps = config.get("applications") or []
    if len(apps) != 1:
        return f"{len(apps)} applications"
    for deployment in apps[0].get("deployments") or []:
        if deployment.get("name") != INGRESS_NAME:
            continue
        if deployment.get("autoscaling_config"):
            return "an autoscaled ingress"
        if deployment.get("num_replicas", 1) != 1:
            return f"an ingress of {deployment['num_replicas']} replicas"
    return ""


def port_taken(config: dict[str, Any]) -> str:
    """Why the command's port cannot be listened on, before a cluster is started for it ("" when
    it can): Serve would otherwise retry its server on it for a long while. Connections still
    closing there (TIME_WAIT) do not count: the proxy and the ingress bind with SO_REUSEADDR."""
    http = config.get("http_options") or {}
    host, port = http.get("host") or "127.0.0.1", int(http.get("port", 8000))
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as exc:
            return f"couldn't bind HTTP server socket, hostname: {host}, port: {port}: {exc}"
    return ""


def reclaimable_port() -> None:
    """In an Ingress replica, before Serve starts its HTTP server there: bind it as Serve binds
    its proxy's (SO_REUSEADDR, SO_REUSEPORT). Serve 2.60 binds a direct-ingress socket without
    them, so after an Ingress replica dies holding a client's connection (which then lingers on
    the port in FIN_WAIT or TIME_WAIT for up to a minute) its replacement cannot bind, Serve
    blocks the port for good, and the command would serve nothing. Serve looks the function up
    at call time; a Serve without it is left alone."""
    if os.environ.get("RAY_SERVE_ENABLE_DIRECT_INGRESS") != "1":
        return
    from ray.serve._private import replica

    start = getattr(replica, "start_asgi_http_server", None)
    if start is None or getattr(start, "reuses_port", False):
        return

    async def start_reusing_port(app: Any, options: Any, *, event_loop: Any,
                                 enable_so_reuseport: bool = False) -> Any:
        return await start(app, options, event_loop=event_loop, enable_so_reuseport=True)

    start_reusing_port.reuses_port = True  # type: ignore[attr-defined]
    replica.start_asgi_http_server = start_reusing_port


def _free_port() -> int:
    """A port free on every interface now, for Serve's proxy."""
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]
