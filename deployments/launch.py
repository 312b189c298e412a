"""Serve a Ray Serve config until SIGTERM or SIGINT, then stop everything this command started.

``python -m deployments.launch configs/local.yaml`` (what ``make serve`` runs) deploys a config
file as ``serve run`` does; the ``mlxray`` command builds its config from llama-server's flags
and runs it here too.

Without RAY_ADDRESS the command starts a Ray cluster of its own and owns every process of it.
The first SIGTERM or SIGINT, to this process or to its whole process group (Ctrl-C in a
terminal, ``kill -- -PGID``, systemd's stop), shuts that cluster down, Serve with it; what of it
still runs after ``GRACE_S`` is killed: a group signal reaches the raylet and the GCS too, and a
shutdown that waits on a dead daemon would wait for ever. A second signal skips the wait. A
cluster joined through RAY_ADDRESS is not the command's: Serve is shut down there, the cluster
left running. The main thread only waits and counts signals: every call into Ray that could block
runs on another thread, so a signal is always handled.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from typing import Any, NoReturn

import psutil
import yaml

GRACE_S = 15.0  # for Serve and Ray to shut down after the first signal
SETTLE_S = 5.0  # for the cluster's processes to exit once Ray has been shut down
SAMPLE_S = 2.0


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
        signal.signal(signal.SIGTERM, self)
        signal.signal(signal.SIGINT, self)


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

    def wait_gone(self, timeout: float) -> list[psutil.Process]:
        deadline = time.monotonic() + timeout
        while (left := self.alive()) and time.monotonic() < deadline:
            time.sleep(0.1)
        return left

    def kill(self) -> None:
        for p in self.alive():
            try:
                p.kill()
            except psutil.Error:
                continue
        self.wait_gone(2.0)


def _in_thread(fn: Callable[[], None]) -> threading.Event:
    """Run ``fn`` on a daemon thread; the event is set when it has returned (or raised)."""
    done = threading.Event()

    def call() -> None:
        try:
            fn()
        except Exception as exc:  # a failing shutdown step must not stop the next one
            print(f"mlxray: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
        finally:
            done.set()

    threading.Thread(target=call, daemon=True).start()
    return done


def _wait(event: threading.Event, signals: Signals, timeout: float,
          pointless: Callable[[], bool]) -> bool:
    """Until ``event``, a second signal, ``timeout`` or ``pointless()``; whether ``event``
    came."""
    deadline = time.monotonic() + timeout
    while not (event.is_set() or signals.hurry.is_set() or time.monotonic() > deadline
               or pointless()):
        event.wait(0.1)
    return event.is_set()


def run(config: dict) -> NoReturn:
    """Deploy ``config`` (a Serve config file's content), serve until a stop signal, stop, and
    end the process (status 1 if an application failed to deploy, else 0)."""
    from ray.serve.schema import ServeDeploySchema

    schema = ServeDeploySchema.model_validate(config)
    signals = Signals()
    signals.install()
    own = OwnProcesses() if not os.environ.get("RAY_ADDRESS") else None
    failure: list[str] = []
    _init_ray(signals)
    try:
        _in_thread(lambda: _deploy_and_watch(schema, config, signals, failure))
        while not signals.stop.wait(SAMPLE_S):
            if own is not None:
                own.sample()
    finally:
        _shut_down(signals, own)
    if failure:
        print(f"mlxray: error: {failure[0]}", file=sys.stderr)
    # the process ends here: Ray's exit hooks and the interpreter's teardown would add seconds,
    # or wait on a cluster that is gone
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(1 if failure else 0)


def _init_ray(signals: Signals, attempts: int = 3) -> None:
    """In the main thread: a local cluster's daemons die with the thread that started them. On
    an overloaded machine the raylet can miss Ray's startup window: try again."""
    import ray
    from ray.serve._private.constants import SERVE_NAMESPACE

    address = os.environ.get("RAY_ADDRESS") or "local"
    # a cluster of its own advertises this machine's MLX device (configs/cluster.yaml asks for it)
    devices = {"resources": {"mlx_device": 1}} if address == "local" else {}
    for attempt in range(attempts):
        try:
            ray.init(address=address, namespace=SERVE_NAMESPACE, **devices)
            break
        except Exception:
            ray.shutdown()
            if attempt == attempts - 1 or signals.stop.is_set():
                raise
    signals.install()  # ray.init sets a SIGTERM handler of its own (sys.exit)


def _deploy_and_watch(schema: Any, config: dict, signals: Signals, failure: list[str]) -> None:
    """Deploy, then watch the applications; a failure stops the command (but not one that the
    stop itself causes, such as Ray's calls failing once the cluster is going)."""
    try:
        _deploy(schema, config, signals, failure)
    except Exception as exc:
        if not signals.stop.is_set():
            failure.append(f"{type(exc).__name__}: {exc}")
            signals.stop.set()


def _deploy(schema: Any, config: dict, signals: Signals, failure: list[str]) -> None:
    """What ``serve run`` does with a config; then announce the applications running, or stop
    the command if one fails to deploy."""
    from ray import serve
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
        states = serve.status().applications
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
                  f"{http.get('port', 8000)}{prefix}", file=sys.stderr, flush=True)
            announced = True
        time.sleep(0.5)


def _shut_down(signals: Signals, own: OwnProcesses | None) -> None:
    """Ray (and Serve on a joined cluster) within GRACE_S, or until a second signal; then, for
    a cluster of our own, every process of it still running is killed."""
    import ray
    from ray import serve

    if own is not None:
        own.sample()

    def graceful() -> None:
        try:
            if own is None:  # a joined cluster stays up: take Serve off it
                serve.shutdown()
        finally:
            ray.shutdown()  # a local cluster: stops it, Serve with it; a joined one: disconnects

    print("mlxray: stopping", file=sys.stderr, flush=True)
    start = time.monotonic()
    # a cluster of our own that is all gone (a group signal reached it too) has nothing left to
    # shut down: a shutdown still waiting waits on the dead
    _wait(_in_thread(graceful), signals, GRACE_S, lambda: own is not None and not own.alive())
    killed = 0
    if own is not None:
        left = own.wait_gone(0.0 if signals.hurry.is_set() else SETTLE_S)
        killed = len(left)
        own.kill()
    print(f"mlxray: stopped in {time.monotonic() - start:.1f} s"
          + (f" ({killed} processes of the local Ray cluster killed)" if killed else ""),
          file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m deployments.launch",
                                description="Serve a Ray Serve config file (as `serve run` "
                                "does) and stop every process it started on SIGTERM or SIGINT.")
    p.add_argument("config", help="a Ray Serve config file, e.g. configs/local.yaml")
    args = p.parse_args(argv)
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    with open(args.config) as f:
        run(yaml.safe_load(f))


if __name__ == "__main__":
    main()
