"""Serve a Ray Serve config until SIGTERM or SIGINT, then stop everything this command started.

``python -m deployments.cli.launch configs/local.yaml`` (what ``make serve`` runs) deploys a config
file as ``serve run`` does; the ``mlxray`` command builds its config from llama-server's flags
and runs it here too.

Without RAY_ADDRESS the command starts a Ray cluster of its own and owns every process of it.
The first SIGTERM or SIGINT, to this process or to its whole process group (Ctrl-C in a
terminal, ``kill -- -PGID``, systemd's stop), or to ``make`` alone, stops that cluster, Serve
with it, much as Ray's node shutdown does: SIGTERM to its daemons, SIGKILL to whatever of it
still runs a few seconds later (at once after a second signal). ``ray.shutdown()`` is not used
for it: it waits on daemons that a group signal has already killed (for ever), and it resets
SIGTERM to its default action while it runs (a second signal would kill the command halfway). A
cluster joined through RAY_ADDRESS is not the command's: Serve is shut down there, the cluster
left running. The main thread only waits and counts signals: every call into Ray that could
block runs on another thread.
"""

from __future__ import annotations

import argparse
import ipaddress
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

import psutil
import yaml

from deployments.cli import ray_auth
from deployments.serve import direct_ingress

GRACE_S = 15.0  # for Serve to shut down on a joined cluster
# SIGHUP: a closed terminal; SIGQUIT: Ctrl-\\ — both stop as SIGTERM does
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT)
STOP_GRACE_S = 3.0  # between SIGTERM and SIGKILL, for a local cluster's processes
SAMPLE_S = 2.0  # how often the command's processes are sampled
WATCH_S = 2.0  # how often the applications' status is read once they run


class Signals:
    """The stop signals received: the first asks for a stop, the second for it at once."""

    def __init__(self) -> None:
        self.stop = threading.Event()
        self.hurry = threading.Event()

    def __call__(self, signum: int, frame: Any) -> None:
        if self.stop.is_set():
            self.hurry.set()
        self.stop.set()

    def install(self) -> None:
        for sig in STOP_SIGNALS:
            signal.signal(sig, self)


class OwnProcesses:
    """This command's descendants (a local cluster's GCS, raylet, dashboard and workers),
    sampled while it runs: a worker whose raylet has died is no longer a descendant, but stays
    known. Processes are told apart by pid and start time, so a reused pid is never touched."""

    def __init__(self) -> None:
        self.known: dict[tuple[int, float], psutil.Process] = {}

    def sample(self) -> None:
        try:
            children = psutil.Process().children(recursive=True)
        except psutil.Error:
            return
        for p in children:
            try:
                self.known.setdefault((p.pid, p.create_time()), p)
            except psutil.Error:
                continue

    def alive(self) -> list[psutil.Process]:
        out = []
        for p in self.known.values():
            try:
                if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                    out.append(p)
            except psutil.Error:
                continue
        return out

    def stop(self, hurry: threading.Event) -> int:
        """Much as Ray's node shutdown: its daemons (this process's children) get SIGTERM, then
        every process still running STOP_GRACE_S later (at once on ``hurry``) gets SIGKILL: the
        daemons do not all exit on SIGTERM while this driver is connected, nor do the workers
        whose raylet is gone. How many had to be killed."""
        try:
            daemons = psutil.Process().children()
        except psutil.Error:
            daemons = []
        for p in daemons:
            _send(p, signal.SIGTERM)
        deadline = time.monotonic() + STOP_GRACE_S
        while (left := self.alive()) and not hurry.is_set() and time.monotonic() < deadline:
            time.sleep(0.1)
        for p in left:
            _send(p, signal.SIGKILL)
        deadline = time.monotonic() + 2.0
        while self.alive() and time.monotonic() < deadline:
            time.sleep(0.1)
        return len(left)


def _send(p: psutil.Process, sig: int) -> None:
    try:
        p.send_signal(sig)  # psutil checks that the pid is still this process
    except psutil.Error:
        pass


def _in_thread(fn: Callable[[], None]) -> threading.Event:
    """Run ``fn`` on a daemon thread; the event is set when it has returned (or raised)."""
    done = threading.Event()

    def call() -> None:
        try:
            fn()
        except Exception as exc:  # reported: nothing waits on this thread to raise it
            print(f"mlxray: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
        finally:
            done.set()

    threading.Thread(target=call, daemon=True).start()
    return done


def _wait(event: threading.Event, signals: Signals, timeout: float) -> None:
    """Until ``event``, a second signal or ``timeout``."""
    deadline = time.monotonic() + timeout
    while not (event.is_set() or signals.hurry.is_set() or time.monotonic() > deadline):
        event.wait(0.1)


def run(config: dict, serve_proxy: bool = False) -> NoReturn:
    """Deploy ``config`` (a Serve config file's content), serve until a stop signal, stop, and
    end the process (status 1 if an application failed to deploy, else 0). Its port is served
    by the ingress replica itself unless ``serve_proxy`` or the config needs Serve's proxy
    (deployments/serve/direct_ingress.py)."""
    taken = _own_port_taken(config)
    if taken:
        print(f"mlxray: error: {taken}", file=sys.stderr)
        sys.exit(1)
    served = direct_ingress.plan(config, serve_proxy)
    os.environ.update(served.env)  # before Ray is imported or started: every process reads it
    if not os.environ.get("RAY_ADDRESS"):
        own_cluster_setup()
    from ray.serve.schema import ServeDeploySchema

    schema = ServeDeploySchema.model_validate(served.config)
    signals = Signals()
    signals.install()
    own = OwnProcesses() if not os.environ.get("RAY_ADDRESS") else None
    failure: list[str] = []
    _init_ray(signals)
    try:
        _in_thread(lambda: _deploy_and_watch(schema, config, served, signals, failure))
        while not signals.stop.wait(SAMPLE_S):
            if own is not None:
                own.sample()
            if parent_make_stopping():
                signals.stop.set()
    finally:
        _shut_down(signals, own)
    if failure:
        print(f"mlxray: error: {failure[0]}", file=sys.stderr)
    # the process ends here: Ray's exit hooks and the interpreter's teardown would add seconds,
    # or wait on a cluster that is gone
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(1 if failure else 0)


# set by own_cluster_setup in the process environment, so that Ray keeps a node on loopback
LOOPBACK_CLUSTER_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"


def own_cluster_setup() -> None:
    """Before Ray is imported, for a cluster of the command's own: Ray's token auth
    (deployments/cli/ray_auth.py), and a node address on loopback that stays there. On Linux
    Ray turns a node address of 127.0.0.1 into the machine's own (services.
    resolve_ip_for_localhost) unless it runs as it does on a Mac, where a cluster stays on
    loopback (RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0, read once at import): then the GCS, the
    raylet, the core workers, the agents and the stream channels listen on 127.0.0.1 only."""
    ray_auth.for_own_cluster()
    try:
        loopback = ipaddress.ip_address(os.environ.get("MLXRAY_NODE_IP", "127.0.0.1")).is_loopback
    except ValueError:  # a host name: the user's choice, left to Ray
        loopback = False
    if loopback:
        os.environ.setdefault(LOOPBACK_CLUSTER_ENV, "0")


def _own_port_taken(config: dict) -> str:
    """Why the port cannot be served, when the command starts a cluster that serves HTTP (a
    joined cluster's proxy may hold the port already)."""
    if os.environ.get("RAY_ADDRESS") or config.get("proxy_location") == "Disabled":
        return ""
    return direct_ingress.port_taken(config)


def parent_make_stopping() -> bool:
    """Whether this command runs under GNU make (``make serve``) and make has been told to stop.
    Sent SIGINT on its own (not to its group, as a terminal does), make passes nothing on: it
    waits for its recipe to end, inside its fatal-signal handler, which /proc shows as the signal
    blocked and no longer caught."""
    try:
        parent = psutil.Process().parent()
        if parent is None or parent.name() != "make":
            return False
        status = Path(f"/proc/{parent.pid}/status").read_text()
    except (psutil.Error, OSError):
        return False
    masks = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
    blocked, caught = int(masks["SigBlk"], 16), int(masks["SigCgt"], 16)
    return any(blocked & (1 << (sig - 1)) and not caught & (1 << (sig - 1))
               for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT))


def _init_ray(signals: Signals, attempts: int = 3) -> None:
    """In the main thread: a local cluster's daemons die with the thread that started them. On
    an overloaded machine the raylet can miss Ray's startup window: try again."""
    import ray
    from ray.serve._private.constants import SERVE_NAMESPACE

    address = os.environ.get("RAY_ADDRESS") or "local"
    # a cluster of its own advertises this machine's MLX device (configs/cluster.yaml asks for it)
    devices = {"resources": {"mlx_device": 1}} if address == "local" else {}
    if address == "local":  # its own cluster: on loopback, no dashboard unless asked (#28)
        devices |= {"_node_ip_address": os.environ.get("MLXRAY_NODE_IP", "127.0.0.1"),
                    "include_dashboard": os.environ.get("MLXRAY_DASHBOARD") == "1"}
    for attempt in range(attempts):
        try:
            ray.init(address=address, namespace=SERVE_NAMESPACE, **devices)
            break
        except Exception:
            ray.shutdown()
            if attempt == attempts - 1 or signals.stop.is_set():
                raise
    signals.install()  # ray.init sets a SIGTERM handler of its own (sys.exit)


def _deploy_and_watch(schema: Any, config: dict, served: direct_ingress.Plan, signals: Signals,
                      failure: list[str]) -> None:
    """Deploy, then watch the applications; a failure stops the command (but not one that the
    stop itself causes, such as Ray's calls failing once the cluster is going)."""
    try:
        _deploy(schema, config, served, signals, failure)
    except Exception as exc:
        if not signals.stop.is_set():
            failure.append(f"{type(exc).__name__}: {exc}")
            signals.stop.set()


def _deploy(schema: Any, config: dict, served: direct_ingress.Plan, signals: Signals,
            failure: list[str]) -> None:
    """What ``serve run`` does with a config; then announce the applications running, or stop
    the command if one fails to deploy."""
    from ray.serve._private import api as serve_api
    from ray.serve.config import gRPCOptions
    from ray.serve.schema import ApplicationStatus

    client = serve_api.serve_start(http_options=schema.http_options.model_dump(),
                                   proxy_location=schema.proxy_location,
                                   grpc_options=gRPCOptions(**schema.grpc_options.model_dump()))
    client.deploy_apps(schema, _blocking=False)
    names = [app["name"] for app in config["applications"]]
    announced = False
    while not signals.stop.is_set():
        # the controller's status protos: serve.status() builds pydantic models that pickle
        # every deployment's router class, a few % of a core at this rate
        states = {s.name: s.app_status for s in client.list_serve_statuses()}
        for name in names:
            state = states.get(name)
            if state is not None and state.status == ApplicationStatus.DEPLOY_FAILED:
                failure.append(f"the application {name} failed to deploy: {state.message}")
                signals.stop.set()
                return
        if not announced and all(name in states and states[name].status
                                 == ApplicationStatus.RUNNING for name in names):
            http = config.get("http_options", {})
            prefix = (config["applications"][0].get("route_prefix") or "/").rstrip("/")
            print(f"mlxray: serving on http://{http.get('host', '127.0.0.1')}:"
                  f"{http.get('port', 8000)}{prefix} {_server_note(served)}", file=sys.stderr,
                  flush=True)
            announced = True
        time.sleep(WATCH_S if announced else 0.5)


def _server_note(served: direct_ingress.Plan) -> str:
    if served.direct:
        return (f"(by the ingress replica; Ray Serve's proxy is on port "
                f"{served.config['http_options']['port']})")
    return f"(through Ray Serve's proxy: {served.reason})"


def _shut_down(signals: Signals, own: OwnProcesses | None) -> None:
    """A cluster of our own is stopped (OwnProcesses.stop), Serve with it. A joined cluster:
    Serve is shut down there and Ray disconnected, for at most GRACE_S."""
    print("mlxray: stopping", file=sys.stderr, flush=True)
    start = time.monotonic()
    killed = 0
    if own is not None:
        own.sample()
        killed = own.stop(signals.hurry)
    else:
        _wait(_in_thread(_leave_joined_cluster), signals, GRACE_S)
    print(f"mlxray: stopped in {time.monotonic() - start:.1f} s"
          + (f" ({killed} processes killed)" if killed else ""), file=sys.stderr, flush=True)


def _leave_joined_cluster() -> None:
    import ray
    from ray import serve

    try:
        serve.shutdown()
    finally:
        ray.shutdown()


# Ray settings for a cluster the command starts (a variable already set wins; token auth is set
# up in deployments/cli/ray_auth.py, for a cluster of the command's own only): no usage
# reports, the HTTP proxy calling the ingress over Ray Serve's gRPC, by value, as the graph's
# own handles do (GraphArgs.handle_transport: less CPU per streamed item),
# and the replicas at the niceness of the command itself, as llama-server and mlx_lm.server run,
# not Ray's 15 for workers (docs/performance.md, "Where the cost is").
# Serve caps a gRPC message at 4 MiB, on the replica's server and on the caller's channel alike: a
# request of many long prompts, or a large answer (embeddings, probabilities), would fail with
# RESOURCE_EXHAUSTED. Every Serve process gets gRPC's own limit (the application's runtime_env
# carries it too, for clusters the command does not start).
GRPC_MESSAGE_ENV = {"RAY_SERVE_REPLICA_GRPC_MAX_MESSAGE_LENGTH": str(2**31 - 1)}
CLUSTER_ENV = {"RAY_USAGE_STATS_ENABLED": "0",
               "RAY_SERVE_PROXY_USE_GRPC": "1", "RAY_worker_niceness": "0", **GRPC_MESSAGE_ENV}


def cluster_env_defaults() -> None:
    for name, value in CLUSTER_ENV.items():
        os.environ.setdefault(name, value)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m deployments.cli.launch",
                                description="Serve a Ray Serve config file (as `serve run` "
                                "does) and stop every process it started on SIGTERM or SIGINT.")
    p.add_argument("config", help="a Ray Serve config file, e.g. configs/local.yaml")
    p.add_argument("--serve-proxy", action="store_true",
                   help="serve HTTP through Ray Serve's proxy, not from the ingress replica")
    args = p.parse_args(argv)
    cluster_env_defaults()
    with open(args.config) as f:
        run(yaml.safe_load(f), args.serve_proxy)


if __name__ == "__main__":
    main()
