"""A model's replicas one by one, for the routes that answer for all of them: /metrics, /slots,
/props' ``total_slots`` and the slot actions.

The StatusBoard (deployments/serve/status.py) knows a model's live replicas: each reports once a
second. The ingress asks each of them through ``ModelReplica.ask(..., replica=<id>)``, a call the
replicas' router sends to that replica (deployments/serve/router.py); every answer says which
replica gave it, so a replica that is gone, or a router that does not pin, is seen for what it
is. A replica that does not answer within ``ASK_TIMEOUT_S`` (gone, or every slot and queue place
taken) is left out of this answer. Without a board (tests/local_graph.py) the one replica
answers.

Slot ids are global and replica-major: the replica of Ray Serve rank ``r`` holds the ids
``r * n_parallel`` to ``r * n_parallel + n_parallel - 1``; its local slot ``i`` is global
``r * n_parallel + i``. Ray Serve keeps ranks 0..N-1 and may renumber one when a replica is
replaced; two replicas that claim one rank for a moment get the first free places after the rest.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ray.serve.handle import DeploymentHandle

from engine.types import GenerationRequest

if TYPE_CHECKING:
    from deployments.serve.endpoint import ModelEndpoint

log = logging.getLogger("mlxray.replicas")

ASK_TIMEOUT_S = 5.0


@dataclass
class Answer:
    """One replica's answer and who gave it; ``place`` is its index in the global slot ids."""

    replica: str
    node: str
    rank: int
    answer: Any
    place: int = 0


async def live(model: str, board: DeploymentHandle | None) -> list[dict]:
    """The model's replicas that reported lately (replica, node, rank), as the board has them."""
    if board is None:
        return []
    try:
        return await board.live.remote(model)
    except Exception:  # noqa: BLE001 - the board restarts: the one-replica answer meanwhile
        log.warning("the status board did not answer", exc_info=True)
        return []


async def replica_count(model: ModelEndpoint, board: DeploymentHandle | None) -> int:
    return max(1, len(await live(model.name, board))) if board is not None else 1


async def _result(call: Any) -> Any:
    return await call


async def ask_each(model: ModelEndpoint, board: DeploymentHandle | None, what: str,
                   *args: Any) -> list[Answer]:
    """``what`` asked of every live replica of the model, the answers in slot order."""
    targets = await live(model.name, board) if board is not None else []
    if targets:
        calls = [model.replica.ask.remote(what, *args, replica=t["replica"]) for t in targets]
    else:
        calls = [model.replica.ask.remote(what, *args)]
    tasks = [asyncio.ensure_future(_result(c)) for c in calls]
    # a late call is left to finish, not cancelled: cancelling a call Ray Serve is still
    # routing slowed the routing of the calls after it (seen here on a loaded machine)
    done, late = await asyncio.wait(tasks, timeout=ASK_TIMEOUT_S)
    for task in late:  # its error, if any, is read (not "never retrieved") and dropped
        task.add_done_callback(lambda t: t.cancelled() or t.exception())
    if late:
        log.info("%d replica(s) did not answer %s within %ss", len(late), what, ASK_TIMEOUT_S)
    answers: dict[str, Answer] = {}
    for task in tasks:
        if task not in done or task.exception() is not None:
            if task in done:
                log.info("a replica did not answer %s: %r", what, task.exception())
            continue
        who, answer = task.result()["identity"], task.result()["answer"]
        answers.setdefault(who["replica"], Answer(who["replica"], who["node"], who["rank"],
                                                  answer))
    return placed(list(answers.values()))


def placed(answers: list[Answer]) -> list[Answer]:
    """Sorted by rank (then id), each at its rank's place unless an earlier one took it."""
    taken: set[int] = set()
    ordered = sorted(answers, key=lambda a: (a.rank, a.replica))
    for answer in ordered:
        answer.place = answer.rank if answer.rank not in taken else max(taken) + 1
        taken.add(answer.place)
    return ordered


def owner(targets: list[dict], global_id: int, n_parallel: int) -> tuple[dict, int] | None:
    """The live replica holding global slot ``global_id``, and its local slot id."""
    places = placed([Answer(t["replica"], t["node"], t["rank"], None) for t in targets])
    place, local = divmod(global_id, n_parallel)
    for answer in places:
        if answer.place == place:
            return {"replica": answer.replica, "node": answer.node}, local
    return None


async def pin_to_slot(requests: list[GenerationRequest], id_slot: int, model: str,
                      n_parallel: int, board: DeploymentHandle | None) -> None:
    """A generation that names a global slot goes to the replica holding it (the engine takes
    the id modulo its slots: the local slot); one no live replica holds goes to any."""
    found = owner(await live(model, board), id_slot, n_parallel) if id_slot >= 0 else None
    if found is not None:
        for request in requests:
            request.replica = found[0]["replica"]
