"""Prefill waves: how many prompts mlx-lm's ``BatchGenerator`` takes into its prompt batch.

llama.cpp fills each decode call with at most ``n_batch`` tokens, prompts taken in arrival order;
``BatchGenerator`` instead takes up to ``prefill_batch_size`` prompts at once and reads a chunk of
``prefill_step_size`` tokens of each per step. With that size fixed at the slot count, a burst of
sixteen prompts is read in one step of sixteen chunks, and none of them gets its first token
before the whole burst is read (nor does any running sequence get its next one). Sized before
each step to the prompts whose next chunks fit ``n_batch`` tokens (one at least), a burst goes in
``n_batch``-token waves: the first wave's first tokens come after a wave's time, the running
sequences decode between waves, and the burst as a whole costs the same tokens. The generator's
queue is read in engine/batching.py (mlx-lm's internals).
"""

from __future__ import annotations


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
