"""A model replica split over ``shards`` ranks: rank 0 is the Serve replica's own process, ranks
1..N-1 are Ray actors it starts in a placement group of its own.

The placement group has one bundle per rank actor (rank 0 needs none: Serve placed the replica
with its own ``ray_actor_options``, its device included). Each bundle asks for an ``mlx_device``
when the replica was given one (configs/cluster.yaml), so the ranks land on distinct devices,
spread over the nodes when there are several (strategy SPREAD, which still packs one node when
it has the room). The group and the actors belong to the replica: when Serve replaces it, Ray
removes them with it.

MLX's ring backend joins the ranks over TCP: every rank reports a free port on its node, the
replica writes the list (MLX's hostfile: one ``["ip:port"]`` per rank) and hands it to every rank,
and each sets MLX_RANK and MLX_HOSTFILE and calls ``mx.distributed.init(backend="ring")``. Then
every rank loads its part of the weights (engine/sharding.py) and runs the same engine in
lockstep (engine/lockstep.py).
"""

from __future__ import annotations

import json
import os
import socket
import tempfile
import time
from dataclasses import dataclass
from typing import Any

import ray
from ray.util.placement_group import PlacementGroup, placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from deployments.api.config import GraphArgs
from deployments.serve.engines import engine_config
from engine.types import EngineError

PLACEMENT_TIMEOUT_S = 120.0
RANK_CPUS = 0.5
# What a rank's bundle copies from the resources Serve gave the replica (the device, if any).
DEVICE_RESOURCES = ("mlx_device", "GPU")


def join_ring(rank: int, hosts: list[str]) -> Any:
    """This process's place in the ring: the hostfile written here, the group returned."""
    import mlx.core as mx

    with tempfile.NamedTemporaryFile("w", suffix=".json", prefix="mlxray-ring-",
                                     delete=False) as f:
        json.dump([[h] for h in hosts], f)
    os.environ["MLX_RANK"], os.environ["MLX_HOSTFILE"] = str(rank), f.name
    try:
        group = mx.distributed.init(strict=True, backend="ring")
    finally:
        os.unlink(f.name)  # read by init
    if group.size() != len(hosts) or group.rank() != rank:
        raise RuntimeError(f"the ring has rank {group.rank()} of {group.size()}, not {rank} of "
                           f"{len(hosts)} (was MLX's distributed group made earlier here?)")
    return group


def ring_address() -> str:
    """This node's address and a port free on it now, for the ring to listen on."""
    with socket.socket() as s:
        s.bind(("", 0))
        port = s.getsockname()[1]
    return f"{ray.util.get_node_ip_address()}:{port}"



@ray.remote(num_cpus=0)
class ShardRank:
    """Rank 1..N-1: its part of the weights and a follower engine, stepping with rank 0."""

    def __init__(self) -> None:
        self.engine = None

    def address(self) -> str:
        return ring_address()

    def start(self, rank: int, hosts: list[str], args: GraphArgs) -> int:
        from engine.lockstep import FollowerEngine
        from engine.sharding import load_sharded

        group = join_ring(rank, hosts)
        loaded = load_sharded(args.model_path, args.shard_mode, group, args.device)
        self.engine = FollowerEngine(loaded, engine_config(args), group)
        self.engine.start()
        return os.getpid()

    def wake(self) -> None:
        self.engine.wake()

    def alive(self) -> bool:
        return self.engine is not None and self.engine.alive

    def state(self) -> dict:
        return {"pid": os.getpid(), "node": ray.get_runtime_context().get_node_id(),
                **self.engine.debug_state()}


@dataclass
class Shards:
    """Rank 0's view of the other ranks: their actors, pids and placement group."""

    group: PlacementGroup
    ranks: list[Any]
    pids: list[int]

    async def check(self, timeout: float = 5.0) -> None:
        """Raise unless every rank answers that its engine loop runs."""
        import asyncio

        try:
            alive = await asyncio.wait_for(
                asyncio.gather(*(r.alive.remote() for r in self.ranks)), timeout)
        except Exception as exc:  # noqa: BLE001 - a dead actor or no answer: the rank is gone
            raise RuntimeError(f"a shard rank is gone: {exc}") from exc
        if not all(alive):
            raise RuntimeError(f"a shard rank's engine loop died: ranks {alive}")

    def wake(self) -> None:
        """Idle ranks wait for this before rank 0's next turn (engine/lockstep.py)."""
        for rank in self.ranks:
            rank.wake.remote()

    async def states(self) -> list[dict]:
        import asyncio

        return list(await asyncio.gather(*(r.state.remote() for r in self.ranks)))

    def close(self) -> None:
        for rank in self.ranks:
            ray.kill(rank)
        remove_placement_group(self.group)


def device_resources() -> dict[str, float]:
    """The device resources Serve gave this replica: each rank asks for the same."""
    assigned = ray.get_runtime_context().get_assigned_resources()
    return {k: v for k, v in assigned.items() if k in DEVICE_RESOURCES}


def start_leader(args: GraphArgs):
    """Place the ranks, join the ring as rank 0, load the sharded model on every rank and start
    the engines; returns rank 0's engine and the other ranks."""
    from engine.lockstep import LeaderEngine
    from engine.sharding import load_sharded

    device = device_resources()
    pg = placement_group([{"CPU": RANK_CPUS, **device}] * (args.shards - 1), strategy="SPREAD")
    if not _ready(pg):
        remove_placement_group(pg)
        raise EngineError(f"no room for {args.shards - 1} more shard ranks within "
                          f"{PLACEMENT_TIMEOUT_S:.0f} s", 503, "unavailable_error")
    ranks = [ShardRank.options(
        num_cpus=RANK_CPUS, resources={k: v for k, v in device.items() if k != "GPU"},
        num_gpus=device.get("GPU", 0),
        scheduling_strategy=PlacementGroupSchedulingStrategy(pg, placement_group_bundle_index=i),
    ).remote() for i in range(args.shards - 1)]
    shards = Shards(pg, ranks, [])
    try:
        hosts = [ring_address(), *ray.get([r.address.remote() for r in ranks])]
        started = [r.start.remote(i + 1, hosts, args) for i, r in enumerate(ranks)]
        group = join_ring(0, hosts)
        loaded = load_sharded(args.model_path, args.shard_mode, group, args.device)
        shards.pids = ray.get(started)
    except BaseException:
        shards.close()
        raise
    engine = LeaderEngine(loaded, engine_config(args), group, shards.wake)
    return loaded, engine, shards


def _ready(pg: PlacementGroup) -> bool:
    deadline = time.monotonic() + PLACEMENT_TIMEOUT_S
    while time.monotonic() < deadline:
        try:
            ray.get(pg.ready(), timeout=5)
            return True
        except ray.exceptions.GetTimeoutError:
            continue
    return False
