"""The model replica: owns one engine (model, tokenizer, scheduler thread) and serves its events.

The model loads in the background so the ingress can answer 503 "Loading model" meanwhile, as the
reference does; ``check_health`` fails once the engine loop has died, so Ray Serve restarts us.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import AsyncIterator
from pathlib import Path

import ray
from ray import serve

from deployments.api.config import GraphArgs
from deployments.serve import channel
from deployments.serve.engines import EngineMaker, mlx_engine
from deployments.serve.replica_adapters import AdapterError, ReplicaAdapters
from deployments.serve.residency import Residency
from deployments.serve.shards import Shards, start_leader
from deployments.serve.status import (
    engine_snapshot,
    replica_identity,
    replica_rank,
    start_reporting,
)
from engine import aio, device_choice
from engine.seam import EngineLike
from engine.types import EngineError, EngineEvent, FinalEvent, GenerationRequest

log = logging.getLogger("mlxray.replica")


def _log_to_serve() -> None:
    """mlxray's loggers (the device chosen, a GGUF file's tensors and dequantization cost) into
    this replica's Serve log, which Serve also writes to stderr."""
    serve_log, ours = logging.getLogger("ray.serve"), logging.getLogger("mlxray")
    if serve_log.handlers and not ours.handlers:
        ours.setLevel(logging.INFO)
        for handler in serve_log.handlers:
            ours.addHandler(handler)
        ours.propagate = False


def _global_slot_ids(batch: list[EngineEvent], offset: int) -> list[EngineEvent]:
    """An answer's ``id_slot`` as /slots numbers it: replica-major (deployments/serve/
    replicas.py); unchanged on the first replica."""
    if offset:
        for event in batch:
            if isinstance(event, FinalEvent):
                event.id_slot += offset
    return batch


def _model_info(engine: EngineLike) -> dict:
    loaded, vocab = engine.loaded, engine.vocab
    return {
        "path": loaded.path,
        "n_vocab": vocab.n_vocab,
        "n_ctx_train": loaded.n_ctx_train,
        "n_embd": loaded.n_embd,
        "n_params": loaded.n_params,
        "size": loaded.size_bytes,
        "chat_template": loaded.chat_template,
        "ftype": loaded.ftype,
        "bos_token": vocab.detokenize([vocab.bos_id]) if vocab.bos_id is not None else "",
        "eos_token": vocab.detokenize(sorted(vocab.eog_ids)[:1]) if vocab.eog_ids else "",
        "eog_ids": sorted(vocab.eog_ids),
    }


@serve.deployment(name="ModelReplica", max_ongoing_requests=64, health_check_period_s=5)
class ModelReplica:
    def __init__(self, args: GraphArgs, engine_cls: EngineMaker | None = None):
        self.args = args
        self.engine_cls = engine_cls or mlx_engine  # deployments/serve/engines.py
        _log_to_serve()
        device_choice.check(args.device)  # a device MLX cannot run on fails the start, saying so
        self.shards: Shards | None = None  # the other ranks of a sharded replica
        self._info: dict | None = None
        self.adapters = ReplicaAdapters(args)
        self._load_adapter = self.adapters.multiplexed(args.max_adapters_per_replica)
        self._routed = args.routed  # router mode: the first request loads it
        self.residency = Residency(self._make_engine, on_demand=self._routed,
                                   sleep_idle_s=args.sleep_idle_seconds,
                                   forget=self.adapters.forget)
        loop = asyncio.get_running_loop()  # Serve runs the constructor on the replica's loop
        self._tasks = [] if self._routed else [loop.create_task(self._load_at_start())]
        if args.sleep_idle_seconds > 0:
            self._tasks.append(loop.create_task(self.residency.sleep_when_idle()))
        self._reporting = start_reporting(
            args.model_name, lambda: None if self.engine is None else engine_snapshot(self.engine))

    @property
    def engine(self) -> EngineLike | None:
        return self.residency.engine

    def _make_engine(self) -> EngineLike:
        if self.args.shards > 1:
            _, engine, self.shards = start_leader(self.args)
        else:
            engine = self.engine_cls(self.args)
        engine.start()
        self.adapters.load_startup(engine)
        self._info = self._info or _model_info(engine)  # kept: asked while asleep too
        return engine

    async def _load_at_start(self) -> None:
        try:
            await self.residency.load()
        except BaseException:  # surfaced through check_health
            pass

    async def check_health(self) -> None:
        error = self.residency.error
        if error is not None and not self._routed:
            raise RuntimeError(f"model load failed: {error}")
        if self.engine is not None and not self.engine.alive:
            raise RuntimeError(f"engine loop died: {self.engine.error}")
        if self.shards is not None:
            await self.shards.check()

    def _unsharded(self, what: str) -> None:
        """Work that would run on rank 0 alone, out of the ranks' lockstep (engine/lockstep.py)."""
        if self.args.shards > 1:
            raise EngineError(f"{what} is not supported on a sharded replica", 501,
                              "not_supported_error")

    async def ready(self) -> bool:
        """Loaded, or asleep; in router mode as soon as the replica is up (its model loads when
        the router asks for it)."""
        return (self.residency.status in ("loaded", "sleeping")
                or self.args.routed)

    async def load(self) -> dict:
        """Router mode: load the model now (nothing to do once loaded); its state after."""
        try:
            await self.residency.load()
        except Exception:  # noqa: BLE001 - the state says it failed, and why
            pass
        return self.residency.state()

    async def unload(self, only_idle: bool = True) -> dict:
        """Router mode: unload the model unless a request is being answered (``only_idle``)."""
        return {**await self.residency.unload("unloaded", only_idle), **self.residency.state()}

    async def state(self) -> dict:
        return {"pid": os.getpid(), **self.residency.state()}

    async def generate(self, requests: list[GenerationRequest]) -> AsyncIterator[list[EngineEvent]]:
        """Stream the events of one client request (its prompts times n_cmpl, as the shaper
        converted them: deployments/api/engine_requests.py) in batches.

        A refused request yields one batch holding a single ErrorEvent, so the caller can answer
        with a plain JSON error before any frame is sent.
        """
        async with self.residency.busy():
            try:
                engine = await self.residency.current()
                await self.adapters.hold(requests[0].adapters, self._load_adapter)
                stream = aio.generate(engine, requests, self.args.gather)
                first = await anext(stream)
            except EngineError as exc:
                yield [exc.to_event()]
                return
            except AdapterError as exc:
                yield [EngineError(str(exc)).to_event()]
                return
            offset = replica_rank() * self.args.n_parallel  # this replica's global slot ids
            try:
                yield _global_slot_ids(first, offset)
                async for batch in stream:
                    yield _global_slot_ids(batch, offset)
            finally:
                # A client that went away reaches us as a CancelledError at a yield; closing the
                # engine stream now (not whenever it is garbage collected) cancels the group.
                await stream.aclose()

    async def push(self, requests: list[GenerationRequest], reply: channel.ReplyTo) -> int:
        """``generate``'s batches sent on the shared channel to ``reply``'s listener (the
        caller's process); returns how many, once the request has ended."""
        return await channel.pump(self.generate(requests), channel.sender(), reply)

    async def model_info(self) -> dict:
        if self._info is None:
            await self.residency.current()
        return self._info

    async def slot_states(self) -> list[dict]:
        return (await self.residency.current()).slot_states()

    async def control(self, completion_id: str) -> dict:
        """POST /v1/chat/completions/control's ``reasoning_end`` on this replica's engine."""
        async with self.residency.use() as engine:
            return await asyncio.to_thread(engine.control, completion_id)

    async def embed(self, prompts: list[list[int]], pooling: str) -> dict:
        """Pooled hidden states per prompt: {"result": [...]} or {"error": {...}}."""
        from engine import embed

        try:
            self._unsharded("embeddings")
            async with self.residency.use() as engine:
                vectors = await asyncio.to_thread(
                    engine.run_on_loop, lambda e: embed.embed(e, prompts, pooling))
        except EngineError as exc:
            return {"error": {"message": exc.message, "code": exc.code, "type": exc.type}}
        return {"result": vectors}

    async def metrics(self) -> dict:
        """The engine's figures; a sleeping model's are the ones it had (it stays asleep)."""
        if self.engine is None and self.residency.last_metrics is not None:
            return self.residency.last_metrics
        return (await self.residency.current()).metrics_snapshot()

    async def ask(self, what: str, *args: object, replica: str | None = None) -> dict:
        """``metrics``, ``slot_states``, ``slot_action``, ``control`` or ``unload`` answered with
        who answers:
        the ingress names the ``replica`` it means (the router sends the call there,
        deployments/serve/router.py) and checks that it is the one that answered
        (deployments/serve/replicas.py)."""
        if what not in ("metrics", "slot_states", "slot_action", "control", "unload"):
            raise ValueError(f"not askable: {what}")
        identity = replica_identity()
        if what == "slot_action" and replica not in (None, identity["replica"]):
            # the slot's replica went away: another replica's slot must not be touched
            return {"identity": identity, "answer": {"error": {
                "message": "the replica holding this slot is gone", "code": 503,
                "type": "unavailable_error"}}}
        return {"identity": identity, "answer": await getattr(self, what)(*args)}

    async def slot_action(self, id_slot: int, action: str, path: str | None,
                          filename: str) -> dict:
        """save, restore or erase a slot's KV state; the ingress has validated the file path.
        Answers {"result": ...} or {"error": {message, code, type}}."""
        from engine import slot_store

        engine = await self.residency.current()
        if self.args.shards > 1:
            return {"error": {"message": "slot actions are not supported on a sharded replica",
                              "code": 501, "type": "not_supported_error"}}
        if action == "save":
            def call(e):
                return slot_store.save(e, id_slot, Path(path), filename)
        elif action == "restore":
            def call(e):
                return slot_store.restore(e, id_slot, Path(path), filename)
        else:
            def call(e):
                return slot_store.erase(e, id_slot)
        try:
            return {"result": await asyncio.to_thread(engine.run_on_loop, call)}
        except EngineError as exc:
            return {"error": {"message": exc.message, "code": exc.code, "type": exc.type}}
        except Exception as exc:  # noqa: BLE001 - a file system error: the envelope, not a crash
            log.exception("slot %s failed", action)
            return {"error": {"message": f"slot {action} failed: {exc}", "code": 500,
                              "type": "server_error"}}

    async def adapter_state(self) -> dict:
        """This replica's LoRA adapters: loaded now, and on-demand loads so far by name."""
        engine = await self.residency.current()
        return {"pid": os.getpid(), "loaded": sorted(engine.adapters.loaded),
                "loads": dict(self.adapters.loads)}

    async def engine_state(self) -> dict:
        """The engine's bookkeeping and this process's id, for the reliability tests and
        operators: active and queued groups, sequences in the batch, idle slots."""
        state = {"pid": os.getpid(), **(await self.residency.current()).debug_state()}
        if self.shards is not None:  # and each other rank's, to show they step in lockstep
            state["node"] = ray.get_runtime_context().get_node_id()
            state["shard_pids"] = self.shards.pids
            state["shard_states"] = await self.shards.states()
        return state

    async def kill_engine_loop(self) -> None:
        """Fault injection (never routed to HTTP): end the engine loop as a crash would, so that
        check_health fails and Ray Serve replaces this replica. Returns once the loop is dead."""
        engine = await self.residency.current()
        engine.inject_fault(RuntimeError("engine loop killed by kill_engine_loop()"))
        for _ in range(500):
            if not engine.alive:
                return
            await asyncio.sleep(0.01)
        raise RuntimeError("the engine loop is still running")
