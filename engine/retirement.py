"""Retirement: a sequence leaves the batch (its KV cache kept for reuse, its slot freed, its final
event sent), the events of a step flushed once per group, and failures that end one group or all
of them. Methods of ``Engine`` (engine/scheduler.py)."""

from __future__ import annotations

import time

from .lora import adapter_key
from .tasks import Group, Task, units
from .text import first_invalid_utf8
from .types import BAD_OUTPUT_MESSAGE, EngineEvent, ErrorEvent, FinalEvent


class Retirement:
    def _retire(self, task: Task, emit: bool = True) -> None:
        """Leave the batch, keep the KV cache for reuse, free the slot, send the final event."""
        if task.uid >= 0:
            self._by_uid.pop(task.uid, None)
            caches = self._bg.remove([task.uid], return_prompt_caches=True)
            if task.uid in caches:
                cache, cached_tokens = caches[task.uid]
                self.prefix_cache.store(cached_tokens, cache, adapter_key(task.req.adapters))
            self.adapters.release(task.uid)
            task.uid = -1
            if self.adapters.retiring:
                self.adapters.collect(self.adapters_in_use())
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
            slot.cache_key = adapter_key(task.req.adapters)
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
                    self._waiting.extend(units(item[1].tasks))
                elif item is not None and item[0] == "call":
                    item[1]()  # guarded: hands its result or error back to the caller
            while self._waiting:
                unit = self._waiting.popleft()
                self._n_dequeued += len(unit)
                unit[0].group.sink([ErrorEvent(t.req.index, 500, message, "server_error")
                                    for t in unit])
