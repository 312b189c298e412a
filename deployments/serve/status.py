"""The graph's own status: every model replica's slots, queue and token counts in one place.

Each replica reports: a task on its event loop sends a small snapshot to the application's
``StatusBoard`` deployment once a second, and the ingress's ``GET /mlxray/status`` (mlxray's
addition, not llama-server's) reads the board beside Ray Serve's own view of each deployment.
It works with metrics off. The board is also the model's memory for ``/metrics``: which replicas
are live (``live``), and every replica's last counters, kept after it went away (``count``), so
that the sum over replicas never goes down (deployments/serve/replicas.py).
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections import deque
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import ray
from ray import serve
from ray.serve.exceptions import RayServeException
from ray.serve.handle import DeploymentHandle

from engine.tasks import COUNTERS  # summed over a model's replicas; n_tokens_max the largest

log = logging.getLogger("mlxray.status")

BOARD = "StatusBoard"
REPORT_PERIOD_S = 1.0
STALE_AFTER_S = 5.0   # a replica that stopped reporting (stopped, killed) leaves the view
HISTORY_S = 60.0      # tokens per second over the last minute, per model
TASK_KEYS = ("id", "n_prompt", "n_cache", "n_decoded", "n_predict")  # of a slot's task


@dataclass
class ReplicaReport:
    """What one replica tells the board: plain values only (it crosses a Ray call)."""

    model: str
    replica: str
    node: str  # the Ray node the replica runs on
    pid: int
    slots: list[dict]
    n_deferred: int
    tokens_predicted_total: int
    prompt_tokens_total: int
    prompt_tokens_cached_total: int
    rank: int = 0  # Ray Serve's replica rank: the replica's place in the global slot ids
    counters: dict[str, float] = field(default_factory=dict)  # the engine's, COUNTERS
    time: float = field(default_factory=time.time)


# every replica reports once a second: no access log line for each
@serve.deployment(name=BOARD, num_replicas=1, max_ongoing_requests=1000,
                  ray_actor_options={"num_cpus": 0}, logging_config={"enable_access_log": False})
class StatusBoard:
    """The latest report of every replica, and per model the token totals of the last minute."""

    def __init__(self) -> None:
        self.reports: dict[str, ReplicaReport] = {}
        self.history: dict[str, deque[tuple[float, int]]] = {}
        self.ledger: dict[str, dict[str, dict[str, float]]] = {}  # model -> replica -> counters

    async def report(self, report: ReplicaReport) -> None:
        self.reports[report.replica] = report
        self._remember(report.model, {report.replica: report.counters})
        now = time.time()
        self._forget(now)
        total = sum(r.tokens_predicted_total for r in self.reports.values()
                    if r.model == report.model)
        points = self.history.setdefault(report.model, deque())
        points.append((now, total))
        while points and points[0][0] < now - HISTORY_S:
            points.popleft()

    async def snapshot(self) -> dict:
        self._forget(time.time())
        models: dict[str, dict] = {}
        for rep in sorted(self.reports.values(), key=lambda r: (r.model, r.replica)):
            entry = models.setdefault(rep.model, {"replicas": [], "tokens_per_second": []})
            entry["replicas"].append(asdict(rep))
        for name, entry in models.items():
            entry["tokens_per_second"] = rates(list(self.history.get(name, ())))
        return models

    async def live(self, model: str) -> list[dict]:
        """The model's replicas that reported lately: replica, node and rank of each."""
        self._forget(time.time())
        return [{"replica": r.replica, "node": r.node, "rank": r.rank}
                for r in self.reports.values() if r.model == model]

    async def count(self, model: str, fresh: dict[str, dict[str, float]]) -> dict[str, float]:
        """``fresh`` counters (replica -> counters, just asked) remembered, and the model's
        totals over every replica it ever had, gone ones included."""
        return sum_counters(self._remember(model, fresh).values())

    def _remember(self, model: str, counters: dict[str, dict[str, float]]) -> dict:
        """The largest value seen of each replica's counter: a late report cannot lower one."""
        ledger = self.ledger.setdefault(model, {})
        for replica, values in counters.items():
            kept = ledger.setdefault(replica, {})
            for key, value in values.items():
                kept[key] = max(kept.get(key, value), value)
        return ledger

    def _forget(self, now: float) -> None:
        for key in [k for k, r in self.reports.items() if r.time < now - STALE_AFTER_S]:
            del self.reports[key]


def sum_counters(replicas) -> dict[str, float]:
    """Counters summed over replicas; n_tokens_max the largest."""
    totals = dict.fromkeys(COUNTERS, 0.0)
    for values in replicas:
        for key in COUNTERS:
            value = values.get(key, 0)
            totals[key] = max(totals[key], value) if key == "n_tokens_max" else totals[key] + value
    return totals


def rates(points: list[tuple[float, int]]) -> list[list[float]]:
    """[time, tokens/s] between consecutive totals. A total that went down (a replica left the
    sum) gives no point rather than a negative rate."""
    out = []
    for (t0, n0), (t1, n1) in zip(points, points[1:]):
        if t1 > t0 and n1 >= n0:
            out.append([round(t1, 3), round((n1 - n0) / (t1 - t0), 2)])
    return out


def engine_snapshot(engine) -> dict:
    """The report's fields from an ``engine.scheduler.Engine`` (plain values, no locks)."""
    totals = engine.metrics_snapshot(reset_bucket=False)
    slots = [{"id": s["id"], "is_processing": s["is_processing"],
              "task": s["task"] and {k: s["task"][k] for k in TASK_KEYS}}
             for s in engine.slot_states()]
    return {"pid": os.getpid(), "slots": slots, "n_deferred": engine.n_deferred,
            "counters": {k: totals[k] for k in COUNTERS},
            **{k: totals[k] for k in ("tokens_predicted_total", "prompt_tokens_total",
                                      "prompt_tokens_cached_total")}}


def start_reporting(model: str, snapshot: Callable[[], dict | None]) -> asyncio.Task | None:
    """Report ``snapshot()`` (slots, n_deferred, token totals; None while the model loads) to
    this application's board every second. Call it from the replica's constructor: the task runs
    on the replica's own event loop, where Serve handles work whatever
    RAY_SERVE_RUN_USER_CODE_IN_SEPARATE_THREAD says. Outside a Serve replica (a bare engine in a
    test) nothing is started."""
    try:
        context = serve.get_replica_context()
        loop = asyncio.get_running_loop()
    except (RuntimeError, RayServeException):
        return None
    replica = context.replica_id.unique_id
    node = ray.get_runtime_context().get_node_id()

    async def report_forever() -> None:
        board = serve.get_deployment_handle(BOARD, context.app_name)
        while True:
            await asyncio.sleep(REPORT_PERIOD_S)
            values = snapshot()
            if values is None:
                continue
            try:
                await board.report.remote(ReplicaReport(model=model, replica=replica, node=node,
                                                        rank=replica_rank(), **values))
            except Exception:  # noqa: BLE001 - the board restarts; the next second tries again
                log.debug("status report failed", exc_info=True)

    return loop.create_task(report_forever())


def status_board() -> DeploymentHandle | None:
    """This application's board, from inside one of its replicas (None outside Ray Serve)."""
    try:
        return serve.get_deployment_handle(BOARD, serve.get_replica_context().app_name)
    except RayServeException:
        return None


def replica_rank() -> int:
    """This replica's rank (Ray Serve keeps a deployment's ranks 0..N-1 and may renumber them
    as replicas come and go), 0 outside a replica."""
    try:
        rank = serve.get_replica_context().rank
    except RayServeException:
        return 0
    return getattr(rank, "rank", rank) if rank is not None else 0


def replica_identity() -> dict:
    """Who answers: this replica's id, node and rank ("local", "", 0 outside Ray Serve)."""
    try:
        replica = serve.get_replica_context().replica_id.unique_id
    except RayServeException:
        return {"replica": "local", "node": "", "rank": 0}
    return {"replica": replica, "node": ray.get_runtime_context().get_node_id(),
            "rank": replica_rank()}
