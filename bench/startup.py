"""Start-up time (issue #34): ``mlxray -m MODEL`` from process start to its first ``/health`` 200
and its first ``/completion`` 200, with the moments its output first shows each phase (Ray up,
the Serve controller, the proxy, each deployment's replica, the model loaded). Prints
``startup_s`` (to the first /completion 200) per run and the median.

    .venv/bin/python -m bench.startup [--runs 3] [--model models/tiny-python] [--port 8470]
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import statistics
import subprocess
import sys
import threading
import time

import httpx

# first output line matching each pattern: a phase of the start
PHASES = {
    "ray_started": r"Started a local Ray instance|Connected to Ray cluster|ray.init",
    "controller": r"controller|Started Serve",
    "proxy": r"[Pp]roxy.*(starting|started|listening)|Started.*HTTP",
    "replica_Ingress": r"Ingress.*(started|Started|initialized|Replica)",
    "replica_ModelReplica": r"ModelReplica.*(started|Started|initialized|Replica)",
    "model_loaded": r"loaded|Loaded",
    "app_running": r"Application.*(RUNNING|ready)|Deployed app",
}


def watch(proc: subprocess.Popen, start: float, seen: dict[str, float], lines: list[str]) -> None:
    for raw in proc.stdout:  # type: ignore[union-attr]
        line = raw.decode(errors="replace").rstrip()
        lines.append(f"{time.perf_counter() - start:7.2f} {line}")
        for name, pattern in PHASES.items():
            if name not in seen and re.search(pattern, line):
                seen[name] = time.perf_counter() - start


def wait_for(url: str, body: dict | None, deadline: float) -> float | None:
    while time.perf_counter() < deadline:
        try:
            r = (httpx.post(url, json=body, timeout=10) if body is not None
                 else httpx.get(url, timeout=2))
            if r.status_code == 200:
                return time.perf_counter()
        except httpx.HTTPError:
            pass
        time.sleep(0.05)
    return None


def one_run(model: str, port: int, timeout: float, verbose: bool) -> dict[str, float]:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    argv = [sys.executable, "-m", "deployments.cli.command", "-m", model, "--port", str(port),
            "--host", "127.0.0.1", "-np", "1", "-c", "512"]
    start = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env,
                            start_new_session=True)
    seen: dict[str, float] = {}
    lines: list[str] = []
    reader = threading.Thread(target=watch, args=(proc, start, seen, lines), daemon=True)
    reader.start()
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = start + timeout
        health = wait_for(base + "/health", None, deadline)
        first = wait_for(base + "/completion", {"prompt": "x", "n_predict": 1}, deadline)
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=60)
        reader.join(timeout=5)
    if verbose:
        print("\n".join(lines), file=sys.stderr)
    out = {k: round(v, 2) for k, v in seen.items()}
    out["health_200_s"] = round(health - start, 2) if health else float("nan")
    out["startup_s"] = round(first - start, 2) if first else float("nan")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="models/tiny-python")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--port", type=int, default=8470)
    ap.add_argument("--timeout", type=float, default=120.0)
    ap.add_argument("--verbose", action="store_true", help="print the command's output")
    args = ap.parse_args(argv)
    runs = [one_run(args.model, args.port, args.timeout, args.verbose) for _ in range(args.runs)]
    for i, run in enumerate(runs):
        print(f"run {i}: " + " ".join(f"{k}={v}" for k, v in sorted(run.items(), key=lambda kv:
                                                                   kv[1])))
    print(f"startup_s {statistics.median(r['startup_s'] for r in runs):.2f}")
    print(f"health_200_s {statistics.median(r['health_200_s'] for r in runs):.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
