"""Lockstep engines for a model sharded over several ranks (deployments/serve/shards.py places
them).

Every rank holds a part of the weights, so every model call is collective: all ranks must call
the model at the same moments with the same batch. Rather than mirroring each model call and each
KV-cache edit of mlx-lm's BatchGenerator (filter, extend, merge, trims and snapshot copies of the
prefix cache) on the other ranks, every rank runs the same Engine, and the ranks take the same
decisions because they see the same inputs at the same loop iterations:

- rank 0 (``LeaderEngine``, in the Serve replica) takes the requests; at every turn of its loop it
  drains its inbox as usual and hands the other ranks, through one MLX broadcast, what changed the
  scheduler's state that turn: the groups submitted (with their resolved seeds and task ids) and
  the groups cancelled, or a stop, and its clock, which every rank's tokens take as their time;
- the other ranks (``FollowerEngine``) block on that broadcast instead of an inbox, apply the same
  items, then admit and step exactly as rank 0 does. Their events go nowhere: rank 0's are the
  ones returned;
- idle (nothing running, nothing waiting: a state every rank knows alike), rank 0 broadcasts
  nothing until a turn has something in it, and then wakes the ranks first (``wake``: a Ray
  call in deployments/serve/shards.py); an idle rank waits for that wake on an Event, not inside
  the collective, whose ring backend polls its sockets and would hold a core busy all idle long.

Admission, the prefix cache, slot choice, sampling (greedy, or seeded: the seed travels with the
group) and the time limit (``t_max_predict_ms``, on rank 0's clock) depend only on those inputs,
so the schedulers stay identical. Calls run on rank 0's loop (embeddings, slot files, adapters)
would not: deployments/serve/replica.py refuses those on a sharded replica. A rank that dies
breaks the
ring: the next collective raises on every other rank, the loops die, and their health checks fail.

The other design, ranks that only mirror rank 0's model calls, would have to replay every KV-cache
edit BatchGenerator makes, and mlx-lm's internals would become mlxray's protocol; sending each
turn's inputs keeps that protocol to three kinds of message.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import mlx.core as mx
import numpy as np

from .model import LoadedModel
from .scheduler import Engine
from .tasks import EngineConfig, Group, Task
from .text import TextState
from .types import GenerationRequest, GrammarTrigger, ReasoningBudget, SamplingParams
from .wire import Codec

STOP = ("stop", None)
# a turn on the wire: plain data and the request's dataclasses, never pickle (engine/wire.py)
TURNS = Codec((GenerationRequest, SamplingParams, GrammarTrigger, ReasoningBudget))


class Broadcast:
    """Rank 0's bytes to every rank, as two all_sums on the CPU (the others add zeros)."""

    def __init__(self, group: Any):
        self.group = group
        self.leader = group.rank() == 0

    def __call__(self, payload: bytes = b"") -> bytes:
        size = mx.array([len(payload) if self.leader else 0], dtype=mx.int32)
        n = int(mx.distributed.all_sum(size, group=self.group, stream=mx.cpu).item())
        if n == 0:
            return b""
        if self.leader:
            data = mx.array(np.frombuffer(payload, dtype=np.uint8))
        else:
            data = mx.zeros((n,), dtype=mx.uint8)
        summed = mx.distributed.all_sum(data, group=self.group, stream=mx.cpu)
        return np.asarray(summed).tobytes()


class LeaderEngine(Engine):
    """Rank 0: the real engine, which forwards each turn's submits and cancels to the ranks."""

    def __init__(self, loaded: LoadedModel, config: EngineConfig, group: Any,
                 wake: Callable[[], None]):
        super().__init__(loaded, config)
        self._broadcast = Broadcast(group)
        self._wake = wake
        self._turn: list[tuple[str, Any]] = []
        self._turn_time = time.perf_counter()

    def _drain_inbox(self, block: bool) -> None:
        self._turn = []
        super()._drain_inbox(block)
        if self._stopping.is_set():
            self._turn.append(STOP)
        if block:  # idle: the ranks wait for a wake, outside the collective
            if not self._turn:
                return
            self._wake()
        self._turn_time = time.perf_counter()
        self._broadcast(TURNS.dumps((self._turn_time, self._turn)))

    def _clock(self) -> float:
        return self._turn_time

    def _apply(self, kind: str, value: Any) -> None:
        if kind == "submit":
            self._turn.append(("submit", (value.id, [_portable(t) for t in value.tasks])))
        elif kind == "cancel":
            self._turn.append(("cancel", value))
        super()._apply(kind, value)


class FollowerEngine(Engine):
    """Rank 1..N-1: the same engine, fed by rank 0's broadcast; its events are dropped."""

    def __init__(self, loaded: LoadedModel, config: EngineConfig, group: Any):
        super().__init__(loaded, config)
        self._broadcast = Broadcast(group)
        self._woken = threading.Event()
        self._turn_time = 0.0
        self.n_turns = 0

    def wake(self) -> None:
        """Rank 0 has a turn for the idle ranks (called from the rank's actor thread)."""
        self._woken.set()

    def debug_state(self) -> dict:
        return {**super().debug_state(), "n_turns": self.n_turns}

    def _clock(self) -> float:
        return self._turn_time

    def _drain_inbox(self, block: bool) -> None:
        if block:  # idle, as rank 0 is: its next turn comes after a wake
            if not self._woken.wait(0.5):
                return
            self._woken.clear()  # before the collective: rank 0 wakes again only after it
        self._turn_time, turn = TURNS.loads(self._broadcast())
        self.n_turns += 1
        if self._stopping.is_set():  # stop() asked here: leave with the leader's next turn
            return
        for kind, value in turn:
            if kind == "submit":
                group = _group(*value)
                self._n_submitted += len(group.tasks)
                self._apply("submit", group)
            elif kind == "cancel":
                self._apply("cancel", value)
            elif kind == "stop":
                self._stopping.set()


def _portable(task: Task) -> tuple:
    """What a follower needs to rebuild a task: the request (its tag, the client's parameters
    object, stays with rank 0), the resolved seed and the task id."""
    return replace(task.req, tag=None), task.seed, task.id


def _drop(events: list) -> None:
    return None


def _group(group_id: int, tasks: list[tuple]) -> Group:
    group = Group(group_id, [], _drop)
    for req, seed, task_id in tasks:
        stops = [w.encode() for w in req.stop]
        group.tasks.append(Task(req, group, TextState(stops), seed, id=task_id))
    return group
