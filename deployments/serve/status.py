"""The graph's own status: every model replica's slots, queue and token counts in one place.

``/slots`` and ``/metrics`` answer for whichever replica the router picks; the web page's status
view needs them all. A Serve handle cannot address one replica, so each replica reports instead:
a task on its event loop sends a small snapshot to the application's ``StatusBoard`` deployment
once a second, and the ingress's ``GET /mlxray/status`` (mlxray's addition, not llama-server's)
reads the board beside Ray Serve's own view of each deployment. It works with metrics off.
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
    time: float = field(default_factory=time.time)


# every replica reports once a second: no access log line for each
@serve.deployment(name=BOARD, num_replicas=1, max_ongoing_requests=1000,
                  ray_actor_options={"num_cpus": 0}, logging_config={"enable_access_log": False})
class StatusBoard:
    """The latest report of every replica, and per model the token totals of the last minute."""

    def __init__(self) -> None:
        self.reports: dict[str, ReplicaReport] = {}
        self.history: dict[str, deque[tuple[float, int]]] = {}

    async def report(self, report: ReplicaReport) -> None:
        self.reports[report.replica] = report
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

    def _forget(self, now: float) -> None:
        for key in [k for k, r in self.reports.items() if r.time < now - STALE_AFTER_S]:
            del self.reports[key]


def replica_deployment(model_name: str, named: bool) -> str:
    """A model's replica deployment name: ``ModelReplica``, or ``ModelReplica:<model>`` in an
    application of several models (as Ray Serve LLM names its ``LLMServer:<model>``): a path's
    slashes and dots made readable, Serve's replica-id delimiter ``#`` removed."""
    if not named:
        return "ModelReplica"
    return "ModelReplica:" + model_name.replace("/", "--").replace(".", "_").replace("#", "_")


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
                                                        **values))
            except Exception:  # noqa: BLE001 - the board restarts; the next second tries again
                log.debug("status report failed", exc_info=True)

    return loop.create_task(report_forever())
