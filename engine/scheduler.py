"""The engine: one scheduler thread per replica owns the model and every MLX array.

Requests arrive on an inbox; each step admits waiting groups into free slots (prefix-cache lookup
first), runs one prefill chunk and one batched decode step through mlx-lm's ``BatchGenerator``
(continuous batching, chunked prefill, per-sequence samplers and logits processors), applies
llama.cpp's stop rules, and hands each group the events of that step in one call of its sink.
"""

from __future__ import annotations

import copy
import itertools
import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import lru_cache

import mlx.core as mx
from mlx_lm.generate import BatchGenerator

from .cache_snapshots import Snapshots, segments
from .chain import chain_processor, infill_vocab
from .checks import check_prompt
from .device import WiredLimit, engine_stream, without_wired_limit
from .grammar import GrammarCache, GrammarError, GrammarProcessor
from .model import LoadedModel
from .prefix_cache import Hit, PrefixCache
from .sampling import (
    Breakers,
    BudgetState,
    budget_state,
    dry_active,
    dry_breakers,
    greedy,
    greedy_with_bias,
    is_shared,
    make_processors,
    make_sampler,
    prefill_tokens,
    reasoning_budget_processor,
    recorder,
    resolve_seed,
)
from .text import TextState, first_invalid_utf8
from .triggers import TriggerScanner, check_trigger_patterns
from .types import (
    BAD_OUTPUT_MESSAGE,
    EngineError,
    EngineEvent,
    ErrorEvent,
    FinalEvent,
    GenerationRequest,
    ProgressEvent,
    ReasoningBudget,
    SamplingParams,
    StartEvent,
    Timings,
    TokenEvent,
    TokenProb,
    TokenProbs,
)

log = logging.getLogger("mlxray.engine")

Sink = Callable[[list[EngineEvent]], None]


@dataclass
class EngineConfig:
    n_parallel: int = 4
    n_ctx: int = 2048  # per slot
    n_batch: int = 64  # prefill chunk
    cache_entries: int = 0  # prefix-cache entries; 0 means 2 per slot
    max_queue: int = 256  # waiting groups before new requests are refused


@dataclass
class Slot:
    id: int
    task: Task | None = None
    last_used: float = 0.0
    last_tokens: list[int] = field(default_factory=list)
    n_prompt_processed: int = 0
    last: Task | None = None  # the task it ran last, kept for /slots


@dataclass
class Task:
    req: GenerationRequest
    group: Group
    text: TextState
    seed: int
    slot: Slot | None = None
    grammar: GrammarProcessor | None = None
    uid: int = -1
    n_prompt: int = 0
    n_cache: int = 0
    n_gen: int = 0
    tokens: list[int] = field(default_factory=list)
    snapshots: list[int] = field(default_factory=list)  # prompt positions whose cache is kept
    probs: list[TokenProbs] = field(default_factory=list)
    # what the sampling chain recorded for the tokens in flight, oldest first: the raw logits
    # (pre-sampling probabilities) or the candidates' probabilities after the draw
    recorded: deque = field(default_factory=deque)
    t_start: float = 0.0
    t_prompt: float = 0.0
    t_first: float = 0.0
    t_last: float = 0.0
    stop_type: str | None = None
    truncated: bool = False
    # n_cmpl: a child runs on a copy of its parent's evaluated prompt and reports its timings
    parent: Task | None = None
    children: list[Task] = field(default_factory=list)
    id: int = -1
    fault: Exception | None = None  # raised by this sequence's sampler or logits processors

    def timings(self) -> Timings:
        predicted_ms = max(1e-3, (self.t_last - self.t_first) * 1e3) if self.n_gen else 0.0
        src = self.parent or self
        return Timings(
            cache_n=src.n_cache,
            prompt_n=src.n_prompt - src.n_cache,
            prompt_ms=max(0.0, (src.t_prompt - src.t_start) * 1e3) if src.t_prompt else 0.0,
            predicted_n=self.n_gen,
            predicted_ms=predicted_ms,
        )


@dataclass
class Group:
    """The sequences of one client request (several prompts, n_cmpl children): admitted together,
    cancelled together, delivered through one sink."""

    id: int
    tasks: list[Task]
    sink: Sink
    pending: list[EngineEvent] = field(default_factory=list)
    cancelled: bool = False


class Engine:
    def __init__(self, loaded: LoadedModel, config: EngineConfig | None = None):
        self.loaded = loaded
        self.vocab = loaded.vocab
        self.config = config or EngineConfig()
        self.slots = [Slot(i) for i in range(self.config.n_parallel)]
        self.prefix_cache = PrefixCache(self.config.cache_entries or 2 * self.config.n_parallel)
        self.snapshots = Snapshots(loaded.model)
        self.grammars = GrammarCache(loaded.vocab.hf, self.vocab.n_vocab, self.vocab.eog_ids)
        self._inbox: queue.Queue = queue.Queue()
        # admission units in arrival order: one prompt with its n_cmpl children, admitted at once
        self._waiting: deque[list[Task]] = deque()
        self._by_uid: dict[int, Task] = {}
        self._group_ids = itertools.count(1)
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()
        self._bg: BatchGenerator | None = None
        self._stream: mx.Stream | None = None  # on the model's device, made by the loop's thread
        self._wired = WiredLimit()
        self._dirty: dict[int, Group] = {}
        self.error: BaseException | None = None
        # admission units submitted / units that left the queue (admitted, cancelled, failed):
        # each is written by one thread only, so their difference is a lock-free queue length
        self._n_submitted = 0
        self._n_dequeued = 0
        self.n_cancelled = 0  # requests cancelled while queued or running
        self._breakers = lru_cache(maxsize=16)(self._dry_breakers)
        self._infill = infill_vocab(self.vocab)
        self._task_ids = itertools.count(0)
        self.metrics = EngineMetrics()

    def _dry_breakers(self, breakers: tuple[str, ...]) -> Breakers:
        tokenize = lambda text: self.vocab.tokenize(text, False, False)  # noqa: E731
        return dry_breakers(self.vocab.special_pieces, tokenize, list(breakers))

    # ---- public, thread-safe -------------------------------------------------------------
    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="mlxray-engine", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        self._stopping.set()
        self._inbox.put(None)
        if self._thread is not None:
            self._thread.join(timeout)

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive() and self.error is None

    def validate(self, req: GenerationRequest) -> None:
        check_prompt(req.prompt_tokens, self.vocab.n_vocab, self.config.n_ctx)
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
        if self.n_waiting >= self.config.max_queue + len(self._free_slots()):
            raise EngineError("the server is busy: too many queued requests", 503,
                              "unavailable_error")
        group = Group(next(self._group_ids), [], sink)
        for req in requests:
            stops = [w.encode() for w in req.stop]
            group.tasks.append(Task(req, group, TextState(stops), resolve_seed(req.sampling.seed),
                                    id=next(self._task_ids)))
        self._n_submitted += len(_units(group.tasks))
        self._inbox.put(("submit", group))
        return group.id

    def cancel(self, group_id: int) -> None:
        self._inbox.put(("cancel", group_id))

    def slot_states(self) -> list[dict]:
        """A snapshot for /slots (read without locks: plain Python values only). ``task`` is the
        running task, else the last one the slot ran (None if it never ran one)."""
        out = []
        for slot in self.slots:
            task = slot.task or slot.last
            out.append({
                "id": slot.id,
                "n_ctx": self.config.n_ctx,
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

    def run_on_loop(self, fn: Callable[[Engine], object], timeout: float = 60.0) -> object:
        """Run ``fn(engine)`` on the scheduler thread (it owns every MLX array); wait for it."""
        if not self.alive:
            raise EngineError("the engine is not running", 503, "unavailable_error")
        done = threading.Event()
        box: dict[str, object] = {}

        def call() -> None:
            try:
                box["value"] = fn(self)
            except BaseException as exc:  # handed back to the caller's thread
                box["error"] = exc
            finally:
                done.set()

        self._inbox.put(("call", call))
        if not done.wait(timeout):
            raise EngineError("the engine did not answer in time", 503, "unavailable_error")
        if "error" in box:
            raise box["error"]  # type: ignore[misc]
        return box.get("value")

    @property
    def n_active(self) -> int:
        return sum(1 for s in self.slots if s.task is not None)

    @property
    def n_waiting(self) -> int:
        """Prompts (admission units) submitted that hold no slot yet: inbox or waiting queue."""
        return self._n_submitted - self._n_dequeued

    def inject_fault(self, exc: BaseException) -> None:
        """Fault injection: the scheduler thread raises ``exc`` between steps, so the loop dies
        as it would on a crash (the fault tests use it; nothing routes it to HTTP)."""
        self._inbox.put(("raise", exc))

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
            self._wired.restore(self._stream)

    def _new_batch_generator(self) -> BatchGenerator:
        n = self.config.n_parallel
        return without_wired_limit(BatchGenerator(
            self.loaded.model,
            max_tokens=self.config.n_ctx,
            completion_batch_size=n,
            prefill_batch_size=n,
            prefill_step_size=self.config.n_batch,
            stream=self._stream,
        ))

    def _drain_inbox(self, block: bool) -> None:
        try:
            item = self._inbox.get(timeout=0.5) if block else self._inbox.get_nowait()
        except queue.Empty:
            return
        while item is not None:
            kind, value = item
            if kind == "submit":
                self._waiting.extend(_units(value.tasks))
            elif kind == "cancel":
                self._cancel(value)
            elif kind == "call":
                value()
            elif kind == "raise":
                raise value
            try:
                item = self._inbox.get_nowait()
            except queue.Empty:
                item = None

    def _cancel(self, group_id: int) -> None:
        found = False
        for unit in list(self._waiting):
            if unit[0].group.id == group_id:
                self._waiting.remove(unit)
                self._n_dequeued += 1
                unit[0].group.cancelled = found = True
        for slot in self.slots:
            task = slot.task
            if task is not None and task.group.id == group_id:
                task.group.cancelled = found = True
                self._retire(task, emit=False)
        self.n_cancelled += found

    def _free_slots(self) -> list[Slot]:
        return [s for s in self.slots if s.task is None]

    def _admit(self) -> None:
        while self._waiting:
            unit = self._waiting[0]
            if unit[0].group.cancelled:  # a failed request's later prompts
                self._waiting.popleft()
                self._n_dequeued += 1
                continue
            free = self._free_slots()
            if len(free) < len(unit):
                return
            pinned = unit[0].req.id_slot
            if pinned >= 0:
                slot = self.slots[pinned % len(self.slots)]
                if slot.task is not None:
                    return  # the reference defers a task whose slot is busy
                free.remove(slot)
                chosen = [slot]
            else:
                chosen = []
            self._waiting.popleft()
            self._n_dequeued += 1
            for task in unit[len(chosen):]:
                chosen.append(self._pick_slot(free, task.req.prompt_tokens))
            try:
                self._launch_unit(unit, chosen)
            except Exception as exc:  # a request the engine cannot start fails alone
                log.exception("launch failed")
                self._fail_group(unit[0].group, f"got exception: {exc}")

    def _launch_unit(self, unit: list[Task], chosen: list[Slot]) -> None:
        parent = None
        for task, slot in zip(unit, chosen):
            if task.req.child and parent is not None:
                self._reserve(task, slot, parent)
            else:
                parent = task
        for task, slot in zip(unit, chosen):
            if task.parent is None:
                self._launch(task, slot)

    @staticmethod
    def _pick_slot(free: list[Slot], prompt: list[int]) -> Slot:
        """Most similar cached prompt first (LCP ratio above 0.1), else least recently used."""
        best, best_lcp = None, 0
        for slot in free:
            lcp = _common_prefix(slot.last_tokens, prompt)
            if lcp > best_lcp and lcp / max(1, len(prompt)) > 0.1:
                best, best_lcp = slot, lcp
        if best is None:
            best = min(free, key=lambda s: s.last_used)
        free.remove(best)
        return best

    def _reserve(self, child: Task, slot: Slot, parent: Task) -> None:
        """Hold a slot for an n_cmpl child until its parent has evaluated the prompt."""
        slot.task = child
        child.slot = slot
        child.parent = parent
        parent.children.append(child)
        child.n_prompt = len(child.req.prompt_tokens)
        slot.last_tokens = list(child.req.prompt_tokens)

    def _launch(self, task: Task, slot: Slot) -> None:
        req = task.req
        slot.task = task
        task.slot = slot
        task.t_start = time.perf_counter()
        prompt = req.prompt_tokens
        task.n_prompt = len(prompt)
        slot.last_tokens = list(prompt)
        if not prompt:
            task.stop_type = "none"
            for child in [task, *task.children]:
                self._retire(child)
            return
        hit = self.prefix_cache.lookup(prompt) if req.cache_prompt else Hit()
        cache, n_reused = hit.cache, hit.n_reused
        task.n_cache = n_reused
        task.snapshots = self.snapshots.points(len(prompt), hit, req.n_predict, self.config.n_ctx)
        if req.stream:
            self._emit(task, StartEvent(req.index))
        if req.return_progress and req.stream:
            self._emit(task, self._progress(task, n_reused))
        if task.children and n_reused >= len(prompt) - 1:
            self._start_children(task, cache)  # nothing to prefill but the last token
        self._insert(task, prompt[n_reused:], cache, prompt[:n_reused])

    def _insert(self, task: Task, tokens: list[int], cache: list | None,
                context: list[int]) -> None:
        sampler, processors = self._chain(task)
        uid = self._bg.insert_segments(
            [segments(tokens, [p - len(context) for p in task.snapshots])],
            caches=[cache] if cache is not None else None,
            all_tokens=[list(context)],
            samplers=[sampler if is_shared(sampler) else _guarded_sampler(task, sampler)],
            logits_processors=[[_guarded_processor(task, p) for p in processors]],
        )[0]
        task.uid = uid
        self._by_uid[uid] = task

    def _at_cut(self, task: Task, position: int) -> None:
        """A prompt segment was read: keep a snapshot there, start the n_cmpl children from the
        prompt but its last token."""
        is_last = position == task.n_prompt - 1
        if position not in task.snapshots and not (task.children and is_last):
            return
        cache, tokens = self._bg.extract_cache([task.uid])[task.uid]
        if position in task.snapshots:
            self.prefix_cache.store(list(tokens), cache)
        if task.children and is_last:
            self._start_children(task, cache)

    def _start_children(self, parent: Task, cache: list | None) -> None:
        """Each child continues from a copy of the parent's KV cache of the prompt but its last
        token (llama.cpp copies the parent's sequence into the child slots)."""
        prompt = parent.req.prompt_tokens
        for child in parent.children:
            child.t_start = time.perf_counter()
            child.n_cache = len(prompt) - 1
            self._insert(child, prompt[-1:], copy.deepcopy(cache) if cache else None,
                         prompt[:-1])
        parent.children = []

    def _chain(self, task: Task) -> tuple[Callable, list]:
        """The sequence's sampler and logits processors. With n_probs, a first processor records
        the raw logits, or the sampler records the candidates after the draw (post-sampling)."""
        sampling = task.req.sampling
        breakers = self._breakers(tuple(sampling.dry_sequence_breakers)) if (
            dry_active(sampling)) else None
        processors = make_processors(sampling, self.vocab.n_vocab)
        budget = None
        if task.req.reasoning_budget is not None:
            budget = self._reasoning_budget(task.req.reasoning_budget)
            processors.insert(0, reasoning_budget_processor(budget))
        record = None
        if sampling.n_probs > 0 and sampling.post_sampling_probs:
            record = task.recorded.append
        elif sampling.n_probs > 0:
            processors.insert(0, recorder(task.recorded.append))
        if task.req.grammar:
            waiting = TriggerScanner(task.req.grammar_triggers, self._trigger_piece) if (
                task.req.grammar_lazy) else None
            # only a lazy grammar waits for the budget to end (grammar_should_apply)
            hold = budget if task.req.grammar_lazy else None
            task.grammar = self.grammars.processor(task.req.grammar, waiting, hold)
            task.grammar.prefill(self._prefill(task.req.grammar_prefill))  # checked by validate
            processors.append(task.grammar)
        chain = chain_processor(sampling, task.seed, breakers, self._infill)
        if chain is not None:  # the samplers before the draw, in their order, after the grammar
            processors.append(chain)
        sampler = make_sampler(sampling, task.seed, self.vocab.n_vocab, record)
        only_bias = sampling.logit_bias and len(processors) == 1 and sampling.n_probs == 0
        if sampler is greedy and only_bias:  # make_processors puts the bias first
            bias = tuple((t, b) for t, b in sampling.logit_bias)
            return greedy_with_bias(bias, self.vocab.n_vocab), []
        return sampler, processors

    def _reasoning_budget(self, rb: ReasoningBudget) -> BudgetState:
        """Its processor goes before the others, as llama.cpp applies it before its chain; the
        generation prompt's tokens are accepted first (common_sampler_init)."""
        return budget_state(rb, self.vocab.pieces, self._prefill(rb.generation_prompt))

    def _prefill(self, generation_prompt: str) -> list[int]:
        vocab = self.vocab
        return prefill_tokens(generation_prompt, lambda text: vocab.tokenize(text, False),
                              vocab.special_pieces)

    def _trigger_piece(self, token: int) -> bytes:
        """What a lazy grammar's trigger scanner sees of a token: special tokens as text."""
        return self.vocab.piece(token, special=True)

    def _progress(self, task: Task, processed: int) -> ProgressEvent:
        now = time.perf_counter()
        if processed > task.n_cache:
            task.t_prompt = now
        timings = None
        if task.req.timings_per_token:
            timings = Timings(task.n_cache, processed - task.n_cache,
                              (task.t_prompt - task.t_start) * 1e3 if task.t_prompt else 0.0,
                              0, 0.0)
        return ProgressEvent(task.req.index, task.n_prompt, task.n_cache, processed,
                             int((now - task.t_start) * 1e3), timings)

    def _step(self) -> None:
        try:
            prompt_responses, generation_responses = self._bg.next()
        except Exception as exc:  # a failed batch fails the sequences in it, not the loop
            log.exception("batch step failed")
            self._fail_active(f"decode() failed: {exc}")
            self._bg = self._new_batch_generator()
            return
        self.metrics.on_decode(self.n_active)
        for task in [t for t in self._by_uid.values() if t.fault is not None]:
            self._fail_group(task.group, f"got exception: {task.fault}")
        for r in prompt_responses:
            task = self._by_uid.get(r.uid)
            if task is None:
                continue
            done, total = r.progress
            if task.parent is not None:  # a child's one token: its prompt was its parent's
                if task.req.return_progress and task.req.stream and r.end_of_prompt:
                    self._emit(task, self._progress(task, task.n_prompt))
                continue
            task.t_prompt = time.perf_counter()
            if r.end_of_segment and not r.end_of_prompt:
                self._at_cut(task, task.n_cache + done)
            if task.req.return_progress and task.req.stream:
                # BatchGenerator feeds the last prompt token apart; report the reference's chunks
                if r.end_of_prompt or done < total - 1 or done % self.config.n_batch == 0:
                    self._emit(task, self._progress(task, task.n_cache + done))
        finished: list[Task] = []
        for r in generation_responses:
            task = self._by_uid.get(r.uid)
            if task is None:
                continue
            try:
                self._on_token(task, r.token)
            except Exception as exc:  # one bad sequence fails alone
                log.exception("token processing failed")
                task.group.sink([ErrorEvent(task.req.index, 500, f"got exception: {exc}",
                                            "server_error")])
                task.stop_type = "error"
            if task.stop_type is not None or r.finish_reason is not None:
                if task.stop_type is None:
                    task.stop_type, task.truncated = "limit", True
                finished.append(task)
        for task in finished:
            self._retire(task, emit=task.stop_type != "error")

    def _on_token(self, task: Task, token: int) -> None:
        """llama.cpp's process_token: text, stop word, limits, n_indent, time limit, EOG."""
        req = task.req
        recorded = task.recorded.popleft() if task.recorded else None
        now = time.perf_counter()
        task.n_gen += 1
        if task.n_gen == 1:
            task.t_first = task.t_prompt = now
        task.t_last = now
        task.tokens.append(token)
        is_eog = token in self.vocab.eog_ids
        had_new_line = task.text.has_new_line
        # preserved tokens (special ones a tool-call grammar names) are rendered as text
        piece = self.vocab.piece(token, special=token in req.preserved_tokens)
        complete, sent = task.text.add(piece, is_eog)
        if task.text.stopping_word is not None:
            task.stop_type = "word"
        if complete:
            probs = self._probs(token, sent, recorded, req.sampling) if (
                req.sampling.n_probs > 0) else None
            if probs is not None:
                task.probs.append(probs)
            if req.stream and first_invalid_utf8(task.text.generated) == 0:
                task.stop_type = "error"  # the reference's partial parse fails at offset 0
                self._emit(task, ErrorEvent(req.index, 500, BAD_OUTPUT_MESSAGE, "server_error"))
                return
            if req.stream:
                timings = task.timings() if (req.timings_per_token or task.stop_type) else None
                self._emit(task, TokenEvent(req.index, token, sent.decode("utf-8", "replace"),
                                            task.n_gen, task.n_prompt, timings, probs))
        if task.n_prompt + task.n_gen >= self.config.n_ctx:
            task.stop_type, task.truncated = "limit", True
        if task.stop_type is None and req.n_predict != -1 and task.n_gen >= req.n_predict:
            task.stop_type = "limit"
        if had_new_line and req.n_indent > 0 and task.text.indent_cut(req.n_indent):
            task.stop_type = "limit"
        if b"\n" in sent:
            task.text.has_new_line = True
            if 0 < req.t_max_predict_ms < (now - task.t_first) * 1e3:
                task.stop_type = "limit"
        if is_eog:
            task.stop_type = "eos"
        if task.grammar is not None and task.grammar.error:
            # every token the grammar allowed was banned (logit_bias): the sequence fails alone
            raise EngineError(f"the output does not match the grammar: {task.grammar.error}")

    def _probs(self, token: int, sent: bytes, recorded: mx.array | None,
               sampling: SamplingParams) -> TokenProbs:
        if sampling.post_sampling_probs:
            return self._post_sampling_probs(token, sent, recorded, sampling.n_probs)
        logprobs = recorded.reshape(-1).astype(mx.float32)
        logprobs = logprobs - mx.logsumexp(logprobs)
        top_ids, top_vals = _top(logprobs, sampling.n_probs)
        chosen = logprobs[token].item()
        top = [TokenProb(i, self.vocab.piece(i), v) for i, v in zip(top_ids, top_vals)]
        return TokenProbs(token, sent, chosen if chosen > float("-inf") else -3.4028234663852886e38,
                          top)

    def _post_sampling_probs(self, token: int, sent: bytes, recorded: mx.array | None,
                             n: int) -> TokenProbs:
        """The candidates after the draw, most likely first, cut at the first zero; greedy
        sampling leaves one candidate."""
        if recorded is None:  # the shared greedy path records nothing: its one candidate
            return TokenProbs(token, sent, 1.0, [TokenProb(token, self.vocab.piece(token), 1.0)])
        probs = recorded.reshape(-1).astype(mx.float32)
        top_ids, top_vals = _top(probs, n)
        top = [TokenProb(i, self.vocab.piece(i), v)
               for i, v in itertools.takewhile(lambda c: c[1] > 0.0, zip(top_ids, top_vals))]
        return TokenProbs(token, sent, probs[token].item(), top)

    def _retire(self, task: Task, emit: bool = True) -> None:
        """Leave the batch, keep the KV cache for reuse, free the slot, send the final event."""
        if task.uid >= 0:
            self._by_uid.pop(task.uid, None)
            caches = self._bg.remove([task.uid], return_prompt_caches=True)
            if task.uid in caches:
                cache, cached_tokens = caches[task.uid]
                self.prefix_cache.store(cached_tokens, cache)
            task.uid = -1
        self.metrics.on_retire(task.n_prompt - task.n_cache, task.n_cache,
                               task.timings().prompt_ms, task.n_gen,
                               (task.t_last - task.t_first) if task.n_gen else 0.0,
                               task.n_prompt + task.n_gen)
        slot = task.slot
        if slot is not None:
            slot.task = None
            slot.last = task
            slot.last_used = time.perf_counter()
            # the tokens its cache holds: BatchGenerator has read every token it returned
            slot.last_tokens = task.req.prompt_tokens + task.tokens
        if emit and not task.group.cancelled:
            if first_invalid_utf8(task.text.generated) is not None:
                self._emit(task, ErrorEvent(task.req.index, 500, BAD_OUTPUT_MESSAGE,
                                            "server_error"))
            else:
                self._emit(task, self._final(task))

    def _final(self, task: Task) -> FinalEvent:
        text = task.text
        probs = task.probs
        stopping_word = text.stopping_word.decode("utf-8", "replace") if (
            task.stop_type == "word" and text.stopping_word is not None) else ""
        if task.stop_type == "word" and probs and not task.req.stream:
            n_stop = len(self.vocab.tokenize(stopping_word, add_special=False))
            probs = probs[: len(probs) - min(len(probs), n_stop)]
        return FinalEvent(
            index=task.req.index,
            id_slot=task.slot.id if task.slot is not None else 0,
            content=bytes(text.generated).decode("utf-8", "replace"),
            tokens=list(task.tokens),
            stop_type=task.stop_type or "none",
            stopping_word=stopping_word,
            n_prompt=task.n_prompt,
            n_predicted=task.n_gen,
            tokens_cached=max(0, task.n_prompt + task.n_gen - 1),
            truncated=task.truncated,
            has_new_line=text.has_new_line,
            timings=task.timings(),
            prompt=self.vocab.detokenize(task.req.prompt_tokens, special=True),
            probs=probs,
        )

    def _emit(self, task: Task, event: EngineEvent) -> None:
        task.group.pending.append(event)
        self._dirty[task.group.id] = task.group

    def _flush(self) -> None:
        """One sink call per group per step: everything ready crosses together."""
        for group in self._dirty.values():
            events, group.pending = group.pending, []
            if events and not group.cancelled:
                group.sink(events)
        self._dirty.clear()

    def _fail_active(self, message: str) -> None:
        for slot in self.slots:
            task = slot.task
            if task is not None:
                task.group.sink([ErrorEvent(task.req.index, 500, message, "server_error")])
                task.group.cancelled = True
                self._by_uid.pop(task.uid, None)
                task.uid = -1
                slot.task = None

    def _fail_group(self, group: Group, message: str) -> None:
        """End one group with an error: its sequences leave the batch and free their slots."""
        for task in group.tasks:
            if task.slot is not None and task.slot.task is task:
                self._retire(task, emit=False)
        self._dirty.pop(group.id, None)
        group.pending = []
        if not group.cancelled:
            group.sink([ErrorEvent(t.req.index, 500, message, "server_error") for t in group.tasks])
        group.cancelled = True

    def _fail_all(self, message: str) -> None:
        try:
            self._fail_active(message)
        finally:
            while not self._inbox.empty():  # submits that raced the failure wait there too
                item = self._inbox.get_nowait()
                if item is not None and item[0] == "submit":
                    self._waiting.extend(_units(item[1].tasks))
                elif item is not None and item[0] == "call":
                    item[1]()  # guarded: hands its result or error back to the caller
            while self._waiting:
                unit = self._waiting.popleft()
                self._n_dequeued += 1
                unit[0].group.sink([ErrorEvent(t.req.index, 500, message, "server_error")
                                    for t in unit])


def _units(tasks: list[Task]) -> list[list[Task]]:
    """Split a request into admission units: each prompt with the n_cmpl children that follow it.

    The reference needs n_cmpl free slots at once for a prompt's completions, while the prompts of
    one request are independent tasks: a request may hold more prompts than there are slots.
    """
    units: list[list[Task]] = []
    for task in tasks:
        if task.req.child and units:
            units[-1].append(task)
        else:
            units.append([task])
    return units


@dataclass
class EngineMetrics:
    """llama.cpp's server metrics: totals since start, and a bucket reset at each snapshot that
    gives the throughput gauges."""

    prompt_tokens_total: int = 0
    prompt_tokens_cached_total: int = 0
    prompt_seconds_total: float = 0.0
    tokens_predicted_total: int = 0
    tokens_predicted_seconds_total: float = 0.0
    n_decode_total: int = 0
    n_busy_slots_total: int = 0
    n_tokens_max: int = 0
    bucket_prompt_tokens: int = 0
    bucket_prompt_seconds: float = 0.0
    bucket_predicted_tokens: int = 0
    bucket_predicted_seconds: float = 0.0

    def on_decode(self, n_busy: int) -> None:
        self.n_decode_total += 1
        self.n_busy_slots_total += n_busy

    def on_retire(self, n_prompt: int, n_cached: int, prompt_ms: float, n_predicted: int,
                  predicted_s: float, n_tokens: int) -> None:
        self.prompt_tokens_total += n_prompt
        self.prompt_tokens_cached_total += n_cached
        self.prompt_seconds_total += prompt_ms / 1e3
        self.tokens_predicted_total += n_predicted
        self.tokens_predicted_seconds_total += predicted_s
        self.n_tokens_max = max(self.n_tokens_max, n_tokens)
        self.bucket_prompt_tokens += n_prompt
        self.bucket_prompt_seconds += prompt_ms / 1e3
        self.bucket_predicted_tokens += n_predicted
        self.bucket_predicted_seconds += predicted_s

    def snapshot(self, n_processing: int, n_deferred: int, reset_bucket: bool) -> dict:
        out = {k: getattr(self, k) for k in (
            "prompt_tokens_total", "prompt_tokens_cached_total", "prompt_seconds_total",
            "tokens_predicted_total", "tokens_predicted_seconds_total", "n_decode_total",
            "n_busy_slots_total", "n_tokens_max", "bucket_prompt_tokens",
            "bucket_prompt_seconds", "bucket_predicted_tokens", "bucket_predicted_seconds")}
        out.update(n_processing=n_processing, n_deferred=n_deferred)
        if reset_bucket:
            self.bucket_prompt_tokens = self.bucket_predicted_tokens = 0
            self.bucket_prompt_seconds = self.bucket_predicted_seconds = 0.0
        return out


def _guarded_sampler(task: Task, sampler: Callable) -> Callable:
    """A sampler whose failure is that sequence's alone: the batch gets a placeholder token and
    the step after it fails the sequence's request (see ``Task.fault``)."""

    def sample(logprobs: mx.array) -> mx.array:
        try:
            return sampler(logprobs)
        except Exception as exc:
            task.fault = task.fault or exc
            return mx.argmax(logprobs, axis=-1)

    return sample


def _guarded_processor(task: Task, processor: Callable) -> Callable:
    def process(tokens: mx.array, logits: mx.array) -> mx.array:
        try:
            return processor(tokens, logits)
        except Exception as exc:
            task.fault = task.fault or exc
            return logits

    return process


def _top(values: mx.array, n: int) -> tuple[list[int], list[float]]:
    """The ``n`` largest values of a vector, largest first, with their indices."""
    n = min(n, values.shape[-1])
    ids = mx.argpartition(-values, n - 1)[:n]
    order = mx.argsort(-values[ids])
    ids = ids[order]
    return ids.tolist(), values[ids].tolist()


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n
