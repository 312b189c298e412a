"""A fake engine (engine/seam.py's EngineLike) for the tests of the API and graph layers: the
model's tokenizer, no model, no MLX. Ray Serve LLM's tests run their graph on a mock engine the
same way.

It has the real engine's slots, queue bound, groups, cancellation, stop strings and limits
(llama.cpp's ``process_token`` rules: engine/text.py), timings and metrics, so routes,
envelopes, shaping and SSE framing see what they see from the real one. Its tokens are
deterministic: word tokens of the vocabulary picked from the prompt (and the seed, when a
temperature samples), never an end of generation, one per sequence per step: the sampling
settings do not change them. What only a model does (a grammar, a reasoning budget, token
probabilities, n_indent, a time limit, LoRA adapters) it refuses in words (501), never ignores;
what needs the model's state (embeddings, slot files) fails on its thread, as a bug would.
"""

from __future__ import annotations

import itertools
import time
import zlib
from dataclasses import dataclass, field
from typing import Any

from .checks import check_prompt, check_queue_room, sampler_init_error
from .engine_thread import EngineThread
from .tasks import EngineMetrics, Group, Sink, Slot, Task
from .text import TextState
from .types import (
    RANDOM_SEED,
    EngineConfig,
    EngineError,
    FinalEvent,
    GenerationRequest,
    ProgressEvent,
    StartEvent,
    TokenEvent,
)
from .vocab import Vocab, load_vocab


@dataclass
class FakeModel:
    """What /props and /v1/models report of the model (engine/seam.py's ModelFacts)."""

    path: str
    n_ctx_train: int = 2048
    n_embd: int = 0
    n_params: int = 0
    size_bytes: int = 0
    chat_template: str | None = None
    ftype: str = "fake"
    device: Any = None


@dataclass
class NoAdapters:
    loaded: dict[str, Any] = field(default_factory=dict)

    def check(self, adapters: tuple[tuple[str, float], ...]) -> str | None:
        return adapters[0][0] if adapters else None


def fake_engine(path: str, config: EngineConfig, step_s: float = 0.0) -> FakeEngine:
    """A fake engine on the tokenizer of the model folder (or GGUF file) at ``path``."""
    vocab = load_vocab(path)
    template = getattr(vocab.hf, "chat_template", None)
    return FakeEngine(FakeModel(path, chat_template=template), vocab, config, step_s)


class FakeEngine(EngineThread):
    THREAD_NAME = "mlxray-fake-engine"

    def __init__(self, loaded: FakeModel, vocab: Vocab, config: EngineConfig,
                 step_s: float = 0.0):
        self.loaded, self.vocab, self.config = loaded, vocab, config
        self.step_s = step_s  # the time one step takes: streams then last long enough to watch
        self.adapters = NoAdapters()
        self.slots = [Slot(i) for i in range(config.n_parallel)]
        self.metrics = EngineMetrics()
        self.error: BaseException | None = None
        self.n_cancelled = 0
        self._words = [t for t in range(vocab.n_vocab) if _is_word(vocab, t)]
        self._init_thread()
        self._waiting: list[list[Task]] = []
        self._group_ids, self._task_ids = itertools.count(1), itertools.count(0)
        self._n_submitted = self._n_dequeued = 0  # sequences in, and out of the queue

    # ---- engine/seam.py's EngineLike ---------------------------------------------------------
    def validate(self, req: GenerationRequest) -> None:
        check_prompt(req.prompt_tokens, self.vocab.n_vocab, self.config.n_ctx)
        missing = self.adapters.check(req.adapters)
        if missing is not None:
            raise EngineError(f"LoRA adapter '{missing}' is not loaded", 503, "unavailable_error")
        if (error := sampler_init_error(req.sampling)) is not None:
            raise EngineError(f"Failed to initialize samplers: {error}")
        unsupported = _unsupported(req)
        if unsupported:
            raise EngineError(f"the fake engine does not run {unsupported}", 501,
                              "not_supported_error")

    def submit(self, requests: list[GenerationRequest], sink: Sink) -> int:
        if not self.alive:
            raise EngineError("the engine is not running", 503, "unavailable_error")
        for req in requests:
            self.validate(req)
        check_queue_room(len(requests), self.n_waiting,
                         self.config.max_queue + sum(s.task is None for s in self.slots))
        group = Group(next(self._group_ids), [], sink)
        for req in requests:
            text = TextState([w.encode() for w in req.stop])
            group.tasks.append(Task(req, group, text, req.sampling.seed, id=next(self._task_ids)))
        self._n_submitted += len(group.tasks)
        self._inbox.put(("submit", group))
        return group.id

    @property
    def n_active(self) -> int:
        return sum(1 for s in self.slots if s.task is not None)

    @property
    def n_waiting(self) -> int:
        return self._n_submitted - self._n_dequeued

    @property
    def n_deferred(self) -> int:
        return sum(len(unit) for unit in list(self._waiting))

    def slot_states(self) -> list[dict]:
        out = []
        for slot in self.slots:
            task = slot.task or slot.last
            out.append({"id": slot.id, "n_ctx": self.config.n_ctx,
                        "speculative": self.config.spec_type != "none",
                        "is_processing": slot.task is not None,
                        "task": None if task is None else {
                            "id": task.id, "n_prompt": task.n_prompt,
                            "n_prompt_processed": task.n_prompt, "n_cache": 0,
                            "n_decoded": task.n_gen, "n_predict": task.req.n_predict,
                            "has_next_token": slot.task is not None,
                            "has_new_line": task.text.has_new_line, "index": task.req.index,
                            "group": task.group.id, "tag": task.req.tag}})
        return out

    def metrics_snapshot(self, reset_bucket: bool = True) -> dict:
        return self.metrics.snapshot(self.n_active, self.n_deferred, reset_bucket)

    def debug_state(self) -> dict:
        return {"alive": self.alive, "n_active": self.n_active, "n_waiting": self.n_waiting,
                "n_sequences": self.n_active,
                "busy_groups": sorted({s.task.group.id for s in self.slots if s.task}),
                "slots_idle": [s.task is None for s in self.slots],
                "n_decode_total": self.metrics.n_decode_total, "n_cancelled": self.n_cancelled,
                "n_submitted": self._n_submitted}

    # ---- the engine's thread -----------------------------------------------------------------
    def _run(self) -> None:
        try:
            while not self._stopping.is_set():
                self._drain_inbox(block=self.n_active == 0 and not self._waiting)
                self._admit()
                if self.n_active:
                    self._step()
        except BaseException as exc:  # the loop died: health checks see it
            self.error = exc
            for slot in self.slots:
                if slot.task is not None:
                    slot.task.group.sink([EngineError(f"engine loop died: {exc}", 500,
                                                      "server_error").to_event(slot.task.req.index)])

    def _cancel(self, group_id: int) -> None:
        found = False
        for unit in list(self._waiting):
            if unit[0].group.id == group_id:
                self._waiting.remove(unit)
                self._n_dequeued += len(unit)
                found = unit[0].group.cancelled = True
        for slot in self.slots:
            if slot.task is not None and slot.task.group.id == group_id:
                found = slot.task.group.cancelled = True
                self._free(slot)
        self.n_cancelled += found

    def _admit(self) -> None:
        free = [s for s in self.slots if s.task is None]
        while self._waiting and len(free) >= len(self._waiting[0]):
            unit = self._waiting.pop(0)
            self._n_dequeued += len(unit)
            events: list = []
            for task in unit:
                slot = free.pop(0)
                slot.task, task.slot = task, slot
                task.n_prompt = len(task.req.prompt_tokens)
                task.t_start = task.t_prompt = time.perf_counter()
                if task.req.stream and not task.req.child:
                    events.append(StartEvent(task.req.index))
                if task.req.stream and task.req.return_progress:
                    events.append(ProgressEvent(task.req.index, task.n_prompt, 0,
                                                task.n_prompt, 0))
                if not task.req.prompt_tokens or task.req.n_predict == 0:
                    task.stop_type = "limit" if task.req.prompt_tokens else "none"
            if events:
                unit[0].group.sink(events)
        for slot in self.slots:
            if slot.task is not None and slot.task.stop_type is not None:
                self._finish(slot)

    def _step(self) -> None:
        if self.step_s:
            time.sleep(self.step_s)
        self.metrics.on_decode(self.n_active)
        for slot in self.slots:
            task = slot.task
            if task is None:
                continue
            token = self._words[(_key(task) + task.n_gen) % len(self._words)]
            out = self._on_token(task, token)
            if task.stop_type is not None:
                self._finish(slot, out)
            elif out:
                task.group.sink(out)

    def _on_token(self, task: Task, token: int) -> list:
        req, now = task.req, time.perf_counter()
        task.n_gen += 1
        task.t_first = task.t_first or now
        task.t_last = now
        task.tokens.append(token)
        _, sent = task.text.add(self.vocab.piece(token), False)
        if task.text.stopping_word is not None:
            task.stop_type = "word"
        elif task.n_prompt + task.n_gen >= self.config.n_ctx:
            task.stop_type, task.truncated = "limit", True
        elif req.n_predict != -1 and task.n_gen >= req.n_predict:
            task.stop_type = "limit"
        if b"\n" in sent:
            task.text.has_new_line = True
        if not req.stream or not sent:
            return []
        timings = task.timings() if (req.timings_per_token or task.stop_type) else None
        return [TokenEvent(req.index, token, sent.decode("utf-8", "replace"), task.n_gen,
                           task.n_prompt, timings)]

    def _finish(self, slot: Slot, events: list | None = None) -> None:
        task = slot.task
        assert task is not None
        self.metrics.on_retire(task.n_prompt, 0, task.timings().prompt_ms, task.n_gen,
                               task.t_last - task.t_first if task.n_gen else 0.0,
                               task.n_prompt + task.n_gen)
        word = task.text.stopping_word
        final = FinalEvent(
            index=task.req.index, id_slot=slot.id,
            content=bytes(task.text.generated).decode("utf-8", "replace"),
            tokens=list(task.tokens), stop_type=task.stop_type or "none",
            stopping_word=word.decode() if task.stop_type == "word" and word else "",
            n_prompt=task.n_prompt, n_predicted=task.n_gen,
            tokens_cached=max(0, task.n_prompt + task.n_gen - 1), truncated=task.truncated,
            has_new_line=task.text.has_new_line, timings=task.timings(),
            prompt=self.vocab.detokenize(task.req.prompt_tokens, special=True))
        self._free(slot)
        task.group.sink([*(events or []), final])

    def _free(self, slot: Slot) -> None:
        slot.last, slot.task = slot.task, None


def _unsupported(req: GenerationRequest) -> str:
    """What a request asks for that only a model can do; its sampling settings are not among
    them: the fake's tokens do not depend on them, by design."""
    asked = {"a grammar": bool(req.grammar), "a reasoning budget": req.reasoning_budget is not None,
             "token probabilities": req.sampling.n_probs > 0, "n_indent": req.n_indent > 0,
             "a time limit": req.t_max_predict_ms > 0}
    return ", ".join(name for name, given in asked.items() if given)


def _is_word(vocab: Vocab, token: int) -> bool:
    """A piece of letters, maybe after one space: text every client reads the same way."""
    if token in vocab.special_ids or token in vocab.eog_ids:
        return False
    piece = vocab.piece(token)
    word = piece[1:] if piece.startswith(b" ") else piece
    return word.isalpha() and word.isascii()


def _key(task: Task) -> int:
    """Where a sequence starts in the word list: its prompt's, and its seed's when it samples."""
    seed = task.seed if task.req.sampling.temperature > 0 and task.seed != RANDOM_SEED else 0
    return zlib.crc32(repr((task.req.prompt_tokens, seed)).encode())
