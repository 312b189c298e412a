"""Prefill waves: how many prompts mlx-lm's ``BatchGenerator`` takes into its prompt batch.

llama.cpp fills each decode call with at most ``n_batch`` tokens, prompts taken in arrival order;
``BatchGenerator`` instead takes up to ``prefill_batch_size`` prompts at once and reads a chunk of
``prefill_step_size`` tokens of each per step. With that size fixed at the slot count, a burst of
sixteen prompts is read in one step of sixteen chunks, and none of them gets its first token
before the whole burst is read (nor does any running sequence get its next one). Sized before
each step to the prompts whose next chunks fit ``n_batch`` tokens (one at least), a burst goes in
``n_batch``-token waves: the first wave's first tokens come after a wave's time, the running
sequences decode between waves, and the burst as a whole costs the same tokens.
"""

from __future__ import annotations

from mlx_lm.generate import BatchGenerator


def wave_size(reading: list[int], waiting: list[int], budget: int) -> int:
    """How many prompts the prompt batch may hold this step: those reading now (``reading``:
    their next chunks, in tokens) plus the waiting ones (``waiting``: their first chunks, in
    arrival order) while the chunks fit ``budget`` tokens; never fewer than one in all."""
    used, n = sum(reading), len(reading)
    for chunk in waiting:
        if n and used + chunk > budget:
            break
        used += chunk
        n += 1
    return max(1, n)


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
