"""The engine: one scheduler thread per replica owns the model and every MLX array.

Requests arrive on an inbox; each step admits waiting groups into free slots (prefix-cache lookup
first: engine/admission.py), runs one prefill chunk and one batched decode step through mlx-lm's
``BatchGenerator`` (continuous batching, chunked prefill, per-sequence samplers and logits
processors) and applies llama.cpp's stop rules (engine/stepping.py), then retires finished
sequences and hands each group the events of that step in one call of its sink
(engine/retirement.py). This module is the engine's public, thread-safe face and its loop.
"""

from __future__ import annotations

import itertools
import logging
from collections import deque
from functools import lru_cache

import mlx.core as mx
from mlx_lm.generate import BatchGenerator

from .admission import Admission
from .batching import new_batch_generator
from .cache_snapshots import Snapshots
from .chain import infill_vocab
from .checks import check_prompt, check_queue_room, sampler_init_error
from .device import WiredLimit, engine_stream, release_streams
from .disk_cache import disk_cache
from .draft_model import DraftSettings, ModelDrafts, check_pair
from .engine_thread import EngineThread
from .grammar import GrammarCache, GrammarError
from .kv_quant import KVLayout
from .lora import AdapterSet
from .model import LoadedModel
from .penalties import Breakers, dry_breakers
from .prefix_cache import PrefixCache, cache_bytes
from .retirement import Retirement
from .sampling import resolve_seed
from .stepping import Stepping
from .tasks import EngineConfig, EngineMetrics, Group, Sink, Slot, Task
from .text import TextState
from .triggers import check_trigger_patterns
from .types import EngineError, GenerationRequest

log = logging.getLogger("mlxray.engine")

__all__ = ["Engine", "EngineConfig", "Slot", "check_prompt"]


class Engine(Admission, Stepping, Retirement, EngineThread):
    def __init__(self, loaded: LoadedModel, config: EngineConfig | None = None,
                 draft: LoadedModel | None = None):
        self.loaded = loaded
        self.draft = draft  # --model-draft's model (engine/draft_model.py)
        if draft is not None:
            check_pair(loaded.vocab, draft.vocab, draft.model)
        self.vocab = loaded.vocab
        self.config = config or EngineConfig()
        self.slots = [Slot(i) for i in range(self.config.n_parallel)]
        self.kv = KVLayout(loaded.model, self.config.kv_cache_type)  # a quantized one: -ctk
        self.prefix_cache = PrefixCache(self.config.cache_entries or 2 * self.config.n_parallel,
                                        cache_bytes(self.config.cache_ram_mib),
                                        disk_cache(loaded, self.config, self.kv))
        self.snapshots = Snapshots(loaded.model)
        self.adapters = AdapterSet(loaded.model)  # LoRA adapters, per sequence (engine/lora.py)
        self.grammars = GrammarCache(loaded.vocab.hf, self.vocab.n_vocab, self.vocab.eog_ids)
        self._init_thread()
        # admission units in arrival order: one prompt with its n_cmpl children, admitted at once
        self._waiting: deque[list[Task]] = deque()
        self._by_uid: dict[int, Task] = {}
        self._group_ids = itertools.count(1)
        self._bg: BatchGenerator | None = None
        self._stream: mx.Stream | None = None  # on the model's device, made by the loop's thread
        self._wired = WiredLimit()
        self._dirty: dict[int, Group] = {}
        self.error: BaseException | None = None
        # sequences submitted / sequences that left the queue (admitted, cancelled, failed):
        # each is written by one thread only, so their difference is a lock-free queue length
        self._n_submitted = 0
        self._n_dequeued = 0
        self.n_cancelled = 0  # requests cancelled while queued or running
        self._breakers = lru_cache(maxsize=16)(self._dry_breakers)
        self._infill = infill_vocab(self.vocab)
        self._draws: dict = {}  # the batched draws of this engine's thread (its MLX stream)
        self._task_ids = itertools.count(0)
        self.metrics = EngineMetrics()

    def _dry_breakers(self, breakers: tuple[str, ...]) -> Breakers:
        tokenize = lambda text: self.vocab.tokenize(text, False, False)  # noqa: E731
        return dry_breakers(self.vocab.special_pieces, tokenize, list(breakers))

    # ---- public, thread-safe (start, cancel, run_on_loop, inject_fault: engine_thread.py) -----
    def stop(self, timeout: float = 5.0) -> None:
        super().stop(timeout)
        if self.prefix_cache.disk is not None:
            self.prefix_cache.disk.close()  # what the writer holds reaches the folder

    def validate(self, req: GenerationRequest) -> None:
        check_prompt(req.prompt_tokens, self.vocab.n_vocab, self.config.n_ctx)
        missing = self.adapters.check(req.adapters)
        if missing is not None:
            raise EngineError(f"LoRA adapter '{missing}' is not loaded", 503, "unavailable_error")
        if (error := sampler_init_error(req.sampling)) is not None:
            raise EngineError(f"Failed to initialize samplers: {error}")
        if req.grammar:
            try:
                self.grammars.template(req.grammar)  # compiled once, cached for the launch
            except GrammarError as exc:
                log.info("grammar refused: %s", exc)
                raise EngineError(
                    "Failed to initialize samplers: failed to parse grammar") from None
            except Exception as exc:  # e.g. a tokenizer llguidance cannot read (not "fast")
                log.exception("grammar engine failed")
                raise EngineError(f"Failed to initialize samplers: {exc}", 500,
                                  "server_error") from None
            if req.grammar_lazy:
                check_trigger_patterns(req.grammar_triggers)
            if req.grammar_prefill:
                self._check_grammar_prefill(req)

    def _check_grammar_prefill(self, req: GenerationRequest) -> None:
        """A generation prompt the grammar does not accept fails the sampler initialization, as
        llama.cpp's grammar throws on it."""
        refused = self.grammars.processor(req.grammar).prefill(self._prefill(req.grammar_prefill))
        if refused is not None:
            piece = self.vocab.piece(refused, special=True).decode("utf-8", "replace")
            raise EngineError(f"Failed to initialize samplers: Unexpected empty grammar stack "
                              f"after accepting piece: {piece} ({refused})")

    def submit(self, requests: list[GenerationRequest], sink: Sink) -> int:
        """Queue the sequences of one client request; returns the group id for ``cancel``."""
        if not self.alive:
            raise EngineError("the engine is not running", 503, "unavailable_error")
        for req in requests:
            self.validate(req)
        check_queue_room(len(requests), self.n_waiting,
                         self.config.max_queue + len(self._free_slots()))
        group = Group(next(self._group_ids), [], sink)
        for req in requests:
            stops = [w.encode() for w in req.stop]
            group.tasks.append(Task(req, group, TextState(stops), resolve_seed(req.sampling.seed),
                                    id=next(self._task_ids)))
        self._n_submitted += len(group.tasks)
        self._inbox.put(("submit", group))
        return group.id

    def slot_states(self) -> list[dict]:
        """A snapshot for /slots (read without locks: plain Python values only). ``task`` is the
        running task, else the last one the slot ran (None if it never ran one)."""
        out = []
        for slot in self.slots:
            task = slot.task or slot.last
            out.append({
                "id": slot.id,
                "n_ctx": self.config.n_ctx,
                "speculative": self.config.spec_type != "none",
                "is_processing": slot.task is not None,
                "task": None if task is None else {
                    "id": task.id,
                    "n_prompt": task.n_prompt,
                    "n_prompt_processed": task.n_prompt - task.n_cache if task.t_prompt else 0,
                    "n_cache": task.n_cache,
                    "n_decoded": task.n_gen,
                    "n_predict": task.req.n_predict,
                    "has_next_token": slot.task is not None,
                    "has_new_line": task.text.has_new_line,
                    "index": task.req.index,
                    "group": task.group.id,
                    "tag": task.req.tag,
                },
            })
        return out

    def metrics_snapshot(self, reset_bucket: bool = True) -> dict:
        """Totals since start, the bucket since the last snapshot, and the slots' load now."""
        return self.metrics.snapshot(self.n_active, self.n_deferred, reset_bucket)

    @property
    def n_active(self) -> int:
        return sum(1 for s in self.slots if s.task is not None)

    @property
    def n_waiting(self) -> int:
        """Sequences (prompts times n_cmpl) submitted that hold no slot yet: inbox or waiting
        queue."""
        return self._n_submitted - self._n_dequeued

    def debug_state(self) -> dict:
        """What the reliability tests assert on: nothing held after every request is gone."""
        return {
            "alive": self.alive,
            "n_active": self.n_active,
            "n_waiting": self.n_waiting,
            "n_sequences": len(self._by_uid),
            "busy_groups": sorted({s.task.group.id for s in self.slots if s.task is not None}),
            "slots_idle": [s.task is None for s in self.slots],
            "n_decode_total": self.metrics.n_decode_total,
            "n_cancelled": self.n_cancelled,
            "n_submitted": self._n_submitted,
        }

    def adapters_in_use(self) -> set[str]:
        """The LoRA adapters of every sequence queued, holding a slot or in the batch."""
        tasks = [*self._by_uid.values(), *(s.task for s in self.slots if s.task is not None),
                 *(t for unit in list(self._waiting) for t in unit)]
        return {name for t in tasks for name, _ in t.req.adapters}

    @property
    def n_deferred(self) -> int:
        """Requests waiting for a slot (llama.cpp's deferred tasks)."""
        return sum(len(unit) for unit in list(self._waiting))

    # ---- the scheduler thread ---------------------------------------------------------
    def _run(self) -> None:
        try:
            self._stream = engine_stream(self.loaded.device or mx.default_device())
            self._wired.raise_()  # once for the engine's life, whatever generators come and go
            with mx.stream(self._stream):
                self._bg = self._new_batch_generator()
                while not self._stopping.is_set():
                    self._drain_inbox(block=self.n_active == 0 and not self._waiting)
                    self._admit()
                    if self.n_active:
                        self._step()
                    self._flush()
        except BaseException as exc:  # the loop died: health checks must see it
            log.exception("engine loop died")
            self.error = exc
            self._fail_all(f"engine loop died: {exc}")
        finally:
            try:
                self._wired.restore(self._stream)
            finally:
                release_streams(self._stream)

    def _new_batch_generator(self) -> BatchGenerator:
        return new_batch_generator(self.loaded.model, self.adapters.rows, self.config,
                                   self._stream, self.metrics.spec, self._drafter())

    def _drafter(self) -> ModelDrafts | None:
        if self.draft is None or self.config.spec_type != "draft-simple":
            return None
        c = self.config
        return ModelDrafts(self.draft.model, self.vocab.n_vocab, DraftSettings(
            c.spec_draft_n_max, c.spec_draft_n_min, c.spec_draft_p_min))

    def _cancel(self, group_id: int) -> None:
        found = False
        for unit in list(self._waiting):
            if unit[0].group.id == group_id:
                self._waiting.remove(unit)
                self._n_dequeued += len(unit)
                unit[0].group.cancelled = found = True
        for slot in self.slots:
            task = slot.task
            if task is not None and task.group.id == group_id:
                task.group.cancelled = found = True
                self._retire(task, emit=False)
        self.n_cancelled += found
