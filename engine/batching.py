"""The engine's mlx-lm ``BatchGenerator``, built here, and every mlx-lm internal the engine
touches, in this one module (pyproject.toml's pin names it: they change between mlx-lm minor
versions): the prompt and generation batches that bind each sequence's LoRA rows around the
model's calls (engine/lora.py's RowTable), the generator's wired-limit bookkeeping, its
prompt queue, read to size each prefill wave (engine/prefill_waves.py), and ``BatchKVCache``'s
write index and right padding for engine/kv_quant.py's quantized batch cache."""

from __future__ import annotations

import time

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.generate import BatchGenerator, GenerationBatch, PromptProcessingBatch
from mlx_lm.models.cache import BatchKVCache

from .batched_chain import draw_of, draw_rows
from .lora import RowTable
from .prefill_waves import wave_size
from .spec_pacer import AlwaysSpeculate, DraftCaps, Pacer
from .speculative import NgramDrafts, can_speculate, verify_step
from .types import EngineConfig, SpecCounters


def new_batch_generator(model: nn.Module, rows: RowTable, config: EngineConfig,
                        stream: mx.Stream | None, counters: SpecCounters,
                        drafter=None) -> BatchGenerator:
    """The engine's generator: every slot decodes in one batch, prompts are read
    ``n_batch`` tokens a step, each sequence's adapters bound for its rows; with
    ``--spec-type ngram-simple`` or a ``drafter`` (a draft model's, engine/draft_model.py),
    speculative steps counted in ``counters``."""
    rows.by_uid.clear()
    n = config.n_parallel
    generator = without_wired_limit(AdaptedBatchGenerator(
        model, rows, max_tokens=config.n_ctx, completion_batch_size=n, prefill_batch_size=n,
        prefill_step_size=config.n_batch, stream=stream))
    if config.spec_type == "ngram-simple":
        drafter = NgramDrafts(config.spec_ngram_size_n, config.spec_ngram_size_m)
    if drafter is not None:
        batch = generator._generation_batch
        batch.spec = drafter
        batch.counters = counters
        pacer = Pacer if config.spec_pace else AlwaysSpeculate
        batch.pacer = pacer(drafter.ceiling)
        batch.caps = DraftCaps(drafter.ceiling, adaptive=config.spec_pace)
    return generator


def without_wired_limit(generator: BatchGenerator) -> BatchGenerator:
    """The engine holds the limit, not the generator: its close() must not restore the limit
    it found (mlx-lm 0.32's ``_old_wired_limit``, pinned in pyproject.toml)."""
    generator._old_wired_limit = None
    return generator


def size_prefill_wave(gen: BatchGenerator, budget: int) -> None:
    """Set ``gen.prefill_batch_size`` for its next step from its queue (mlx-lm 0.32's internals:
    ``_currently_processing`` holds each reading prompt's remaining segments first,
    ``_unprocessed_sequences`` each waiting one's segments second)."""
    step = gen.prefill_step_size
    reading = [_next_chunk(seq[0], step) for seq in gen._currently_processing]
    waiting = [min(len(seq[1][0]), step) for seq in gen._unprocessed_sequences]
    gen.prefill_batch_size = wave_size(reading, waiting, budget)


def _next_chunk(segments: list[list[int]], step: int) -> int:
    """Prompt tokens a reading sequence reads next step: none when only its last token is left
    (that one goes to the generation batch)."""
    if not segments or (len(segments) == 1 and len(segments[0]) == 1):
        return 0
    return min(len(segments[0]), step)


# ---- binding the row table around BatchGenerator's model calls --------------------------------
class _PromptBatch(PromptProcessingBatch):
    """Prompt chunks, and the switch to generation (whose first step runs in its constructor)."""

    def prompt(self, tokens):
        with self.model.rows.bind(list(self.uids)):
            return super().prompt(tokens)

    def generate(self, tokens):
        with self.model.rows.bind(list(self.uids)):
            return super().generate(tokens)


class _GenerationBatch(GenerationBatch):
    """mlx-lm 0.32's decode step, with the sequences that share a batched draw
    (engine/batched_chain.py) sampled in one call per draw; the others as mlx-lm samples
    them. A sequence's first token is drawn in mlx-lm's own batch (PromptProcessingBatch's
    ``generate``), by its per-sequence sampler, which moves the same key on. With speculation
    on (engine/speculative.py), a step whose rows draft verifies them all at once and answers
    several tokens per row."""

    spec = None  # the drafter: NgramDrafts, or a draft model's ModelDrafts
    counters: SpecCounters = SpecCounters()
    # the sequences that may speculate, with their own counters (AdaptedBatchGenerator sets it)
    spec_uids: dict[int, SpecCounters]

    def filter(self, keep: list[int]):
        super().filter(keep)
        for uid in set(self.spec_uids) - set(self.uids):
            del self.spec_uids[uid]

    def next(self):
        if self.spec is None:
            return super().next()
        if not can_speculate(self):
            self.pacer.close(0.0)
            return super().next()
        rows = len(self.uids)
        if self.pacer.full():
            self._close_run()
        width = self.pacer.choose(rows)
        if self.pacer.ends_run(rows, width):
            self._close_run()
        start = time.perf_counter()
        responses = self._speculative_next(width) if width else super().next()
        self.pacer.add(rows, width, len(responses), time.perf_counter() - start)
        return responses

    def _close_run(self) -> None:
        start = time.perf_counter()
        mx.eval(self._next_tokens)  # the last plain step's pass, which its run is charged
        self.pacer.close(time.perf_counter() - start)

    def _speculative_next(self, width: int):
        """Draft (each row about its cap, at most ``width``: the drafter's own bounds go
        first), verify, keep each row's accepted prefix."""
        current = self._next_tokens.tolist()
        self.caps.keep(self.uids)
        drafts = self.spec.drafts(self, current, [min(width, self.caps.cap(uid))
                                                  for uid in self.uids])
        if not any(drafts):
            responses = super().next()
            self.spec.verified(self)
            return responses
        self._current_tokens = self._next_tokens
        self._current_logprobs = self._next_logprobs
        with self.model.rows.bind(list(self.uids)):
            emitted, logprobs = verify_step(self, current, drafts, self.counters,
                                           self.spec_uids)
        for uid, draft, row in zip(self.uids, drafts, emitted):
            self.caps.update(uid, len(draft), len(row) - 1)
        self.spec.verified(self)
        return self._responses(emitted, logprobs)

    def _responses(self, emitted: list[list[int]], logprobs: list[list[mx.array]]):
        """mlx-lm's per-token limits and stop tokens over each row's emitted tokens; a row
        that finishes answers no further token."""
        keep, responses = [], []
        for i, (tokens, row_logprobs) in enumerate(zip(emitted, logprobs)):
            for token, lp in zip(tokens, row_logprobs):
                self._num_tokens[i] += 1
                finish = "length" if self._num_tokens[i] >= self.max_tokens[i] else None
                if self._matchers[i].advance(token):
                    finish = "stop"
                done = finish is not None
                responses.append(self.Response(
                    self.uids[i], token, lp, finish,
                    self.extract_cache(i) if done else None, self.tokens[i] if done else None))
                if done:
                    break
            else:
                keep.append(i)
        if len(keep) < len(self.uids):
            self.filter(keep)
        return responses

    def _step(self):
        with self.model.rows.bind(list(self.uids)):
            if not any(draw_of(s) for s in self.samplers):
                return super()._step()
            return self._grouped_step()

    def _grouped_step(self):
        self._current_tokens = self._next_tokens
        self._current_logprobs = self._next_logprobs
        inputs = self._current_tokens
        logits = self.model(inputs[:, None], cache=self.prompt_cache)[:, -1, :]
        sampled, logprobs, token_context = self._sample(inputs, logits)
        self._next_tokens = sampled
        self._next_logprobs = list(logprobs)
        mx.async_eval(self._next_tokens, self._next_logprobs, token_context)
        mx.eval(inputs, self._current_logprobs)
        inputs = inputs.tolist()
        for sti, ti in zip(self.tokens, inputs):
            sti.append(ti)
        return inputs, self._current_logprobs

    def _sample(self, inputs: mx.array, logits: mx.array):
        """Tokens and normalized logits of every row, each batched draw's rows in one call."""
        groups: dict[int, list[int]] = {}
        alone: list[int] = []
        for e, sampler in enumerate(self.samplers):
            found = draw_of(sampler)
            (groups.setdefault(id(found[0]), []) if found else alone).append(e)
        parts = [self._draw_group(rows, logits) for rows in groups.values()]
        token_context: list[mx.array] = []
        if alone:
            parts.append(self._sample_alone(alone, inputs, logits, token_context))
        order = [e for rows, _, _ in parts for e in rows]
        tokens = mx.concatenate([t for _, t, _ in parts])
        logprobs = mx.concatenate([lp for _, _, lp in parts])
        if order != list(range(len(order))):
            back = mx.array(sorted(range(len(order)), key=order.__getitem__))
            tokens, logprobs = tokens[back], logprobs[back]
        return tokens, logprobs, token_context

    def _draw_group(self, rows: list[int], logits: mx.array):
        draw, _ = draw_of(self.samplers[rows[0]])
        rngs = [draw_of(self.samplers[e])[1] for e in rows]
        picked = logits if len(rows) == len(self.uids) else logits[mx.array(rows)]
        tokens, logprobs = draw_rows(draw, picked, rngs)
        return rows, tokens, logprobs

    def _sample_alone(self, rows: list[int], inputs: mx.array, logits: mx.array,
                      token_context: list[mx.array]):
        """mlx-lm's own sampling of the rows no batched draw takes."""
        processed = []
        for e in rows:
            row = logits[e : e + 1]
            processors = self.logits_processors[e] or ()
            if processors:
                context = self._token_context[e].update_and_fetch(inputs[e : e + 1])
                token_context.append(context)
                for processor in processors:
                    row = processor(context, row)
            processed.append(row)
        rows_logits = mx.concatenate(processed, axis=0)
        logprobs = rows_logits - mx.logsumexp(rows_logits, axis=-1, keepdims=True)
        samplers = [self.fallback_sampler if self.samplers[e] is None else self.samplers[e]
                    for e in rows]
        if all(s is samplers[0] for s in samplers):
            tokens = samplers[0](logprobs)
        else:
            tokens = mx.concatenate([s(logprobs[i : i + 1]) for i, s in enumerate(samplers)])
        return rows, tokens, logprobs


class AdaptedModel:
    """The model as BatchGenerator calls it, carrying the row table its batches bind."""

    def __init__(self, model: nn.Module, rows: RowTable):
        self.model = model
        self.rows = rows

    def __call__(self, *args, **kwargs):
        return self.model(*args, **kwargs)

    def __getattr__(self, name: str):
        return getattr(self.model, name)


class AdaptedBatchGenerator(BatchGenerator):
    """mlx-lm's BatchGenerator whose batches bind each sequence's adapters for every call."""

    def __init__(self, model: nn.Module, rows: RowTable, **kwargs):
        adapted = AdaptedModel(model, rows)
        super().__init__(adapted, **kwargs)
        self._prompt_batch = _PromptBatch.empty(adapted, self.sampler,
                                                prefill_step_size=self.prefill_step_size)
        self._generation_batch = _GenerationBatch.empty(adapted, self.sampler)
        self._generation_batch.spec_uids = {}


class OpenBatchKVCache(BatchKVCache):
    """mlx-lm's ``BatchKVCache`` with its private write index and right padding under public
    names, for a subclass that re-implements its methods (engine/kv_quant.py's quantized one)."""

    @property
    def write_index(self) -> int:
        return self._idx

    @write_index.setter
    def write_index(self, value: int) -> None:
        self._idx = value

    @property
    def right_padding(self) -> mx.array | None:
        return self._right_padding

    @right_padding.setter
    def right_padding(self, value: mx.array | None) -> None:
        self._right_padding = value
