"""The engine's mlx-lm ``BatchGenerator``, built here, and every mlx-lm internal the engine
touches, in this one module (pyproject.toml's pin names it: they change between mlx-lm minor
versions): the prompt and generation batches that bind each sequence's LoRA rows around the
model's calls (engine/lora.py's RowTable), the generator's wired-limit bookkeeping, its
prompt queue, read to size each prefill wave (engine/prefill_waves.py), and ``BatchKVCache``'s
write index and right padding for engine/kv_quant.py's quantized batch cache."""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.generate import BatchGenerator, GenerationBatch, PromptProcessingBatch
from mlx_lm.models.cache import BatchKVCache

from .lora import RowTable
from .prefill_waves import wave_size
from .types import EngineConfig


def new_batch_generator(model: nn.Module, rows: RowTable, config: EngineConfig,
                        stream: mx.Stream | None) -> BatchGenerator:
    """The engine's generator: every slot decodes in one batch, prompts are read
    ``n_batch`` tokens a step, each sequence's adapters bound for its rows."""
    rows.by_uid.clear()
    n = config.n_parallel
    return without_wired_limit(AdaptedBatchGenerator(
        model, rows, max_tokens=config.n_ctx, completion_batch_size=n, prefill_batch_size=n,
        prefill_step_size=config.n_batch, stream=stream))


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
    def _step(self):
        with self.model.rows.bind(list(self.uids)):
            return super()._step()


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
