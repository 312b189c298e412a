"""Admission: waiting prompts into free slots. The slot (most similar cached prompt, else least
recently used), the prefix-cache lookup and its snapshot points, n_cmpl children started from
their parent's cache, and each sequence's sampler and logits processors. Methods of ``Engine``
(engine/scheduler.py), run on its scheduler thread."""

from __future__ import annotations

import copy
import logging
import time
from collections.abc import Callable

import mlx.core as mx

from .batched_chain import BatchedDraw, batched_draw, with_batched_draw
from .cache_snapshots import segments
from .chain import chain_processor
from .lora import adapter_key
from .penalties import dry_active, greedy_with_bias, is_shared, make_processors, recorder
from .prefix_cache import Hit
from .reasoning_budget import (
    BudgetState,
    budget_state,
    prefill_tokens,
    reasoning_budget_processor,
)
from .sampling import greedy, make_sampler
from .speculative import speculates
from .tasks import Slot, Task
from .triggers import TriggerScanner
from .types import ReasoningBudget, StartEvent

log = logging.getLogger("mlxray.engine")


class Admission:
    def _free_slots(self) -> list[Slot]:
        return [s for s in self.slots if s.task is None]

    def _admit(self) -> None:
        while self._waiting:
            unit = self._waiting[0]
            if unit[0].group.cancelled:  # a failed request's later prompts
                self._waiting.popleft()
                self._n_dequeued += len(unit)
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
            self._n_dequeued += len(unit)
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
        key = adapter_key(req.adapters)
        hit = self.prefix_cache.lookup(prompt, key) if req.cache_prompt else Hit()
        cache, n_reused = hit.cache, hit.n_reused
        task.n_cache = n_reused
        if hit.n_disk:
            self.metrics.on_disk_hit(hit.n_disk)
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
        sampler, processors, draw = self._chain(task)
        if not is_shared(sampler):
            guarded = _guarded_sampler(task, sampler)
            rng = getattr(sampler, "rng", None)  # a sampler of make_sampler's carries its key
            sampler = guarded if draw is None or rng is None else with_batched_draw(
                guarded, draw, rng)
        cache = cache if cache is not None else self.kv.fresh()
        uid = self._bg.insert_segments(
            [segments(tokens, [p - len(context) for p in task.snapshots])],
            caches=[cache] if cache is not None else None,
            all_tokens=[list(context)],
            samplers=[sampler],
            logits_processors=[[_guarded_processor(task, p) for p in processors]],
        )[0]
        task.uid = uid
        self._by_uid[uid] = task
        self.adapters.assign(uid, task.req.adapters)
        if self.config.spec_type != "none" and speculates(
                task.req.sampling, sampler,
                bool(task.req.grammar) or task.req.reasoning_budget is not None):
            self._bg._generation_batch.spec_uids[uid] = task.spec

    def _at_cut(self, task: Task, position: int) -> None:
        """A prompt segment was read: keep a snapshot there, start the n_cmpl children from the
        prompt but its last token."""
        is_last = position == task.n_prompt - 1
        if position not in task.snapshots and not (task.children and is_last):
            return
        cache, tokens = self._bg.extract_cache([task.uid])[task.uid]
        if position in task.snapshots:
            self.prefix_cache.store(list(tokens), cache, adapter_key(task.req.adapters))
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

    def _chain(self, task: Task) -> tuple[Callable, list, BatchedDraw | None]:
        """The sequence's sampler and logits processors, and the draw its settings share when
        its chain can be drawn in one call with theirs (engine/batched_chain.py). With n_probs,
        a first processor records the raw logits, or the sampler records the candidates after
        the draw (post-sampling)."""
        sampling = task.req.sampling
        breakers = self._breakers(tuple(sampling.dry_sequence_breakers)) if (
            dry_active(sampling)) else None
        processors = make_processors(sampling, self.vocab.n_vocab)
        budget = None
        if task.req.reasoning_budget is not None:
            budget = task.budget = self._reasoning_budget(task.req.reasoning_budget)
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
            return greedy_with_bias(bias, self.vocab.n_vocab), [], None
        alone = task.req.grammar or budget is not None  # processors outside the chain
        return sampler, processors, None if alone else batched_draw(sampling, self.vocab.n_vocab,
                                                                       self._draws)

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


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n
