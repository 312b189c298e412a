"""Slot KV state to and from files (llama-server's POST /slots/{id}?action=save|restore|erase).

A slot's state is the KV cache of the tokens it last held, kept in the prefix cache once its task
retires. Saving writes that cache with mlx-lm's ``save_prompt_cache`` (safetensors, the token ids
in the metadata); restoring puts it back into the prefix cache and makes it the slot's tokens, so
the next prompt sharing the prefix reuses it. Every function runs on the scheduler thread
(``Engine.run_on_loop``): it owns every MLX array.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

from mlx_lm.models.cache import load_prompt_cache, save_prompt_cache

from .lora import BASE_KEY
from .scheduler import Engine, Slot
from .types import EngineError

_TOKENS_KEY = "mlxray_tokens"  # no dots: the metadata keys are unflattened on load
_ADAPTERS_KEY = "mlxray_adapters"


def _idle_slot(engine: Engine, id_slot: int) -> Slot:
    if not 0 <= id_slot < len(engine.slots):
        raise EngineError("Invalid slot ID")
    slot = engine.slots[id_slot]
    if slot.task is not None:
        raise EngineError(f"Slot {id_slot} is busy", 503, "unavailable_error")
    return slot


def save(engine: Engine, id_slot: int, path: Path, filename: str) -> dict:
    start = time.perf_counter()
    slot = _idle_slot(engine, id_slot)
    cache, n_cached = engine.prefix_cache.longest(slot.last_tokens, slot.cache_key)
    tokens = slot.last_tokens[:n_cached]
    if cache is None or not tokens:
        raise EngineError(f"Slot {id_slot} holds no state to save")
    # mx.save_safetensors appends the .safetensors suffix; the client's name is kept as given
    staged = path.with_name(path.name + ".saving.safetensors")
    save_prompt_cache(str(staged), engine.kv.portable(cache), {_TOKENS_KEY: json.dumps(tokens),
                                           _ADAPTERS_KEY: slot.cache_key})
    os.replace(staged, path)
    return {"id_slot": id_slot, "filename": filename, "n_saved": len(tokens),
            "n_written": path.stat().st_size,
            "timings": {"save_ms": (time.perf_counter() - start) * 1e3}}


def restore(engine: Engine, id_slot: int, path: Path, filename: str) -> dict:
    start = time.perf_counter()
    slot = _idle_slot(engine, id_slot)
    staged = path.with_name(path.name + ".loading.safetensors")
    try:
        _stage(path, staged)  # mx.load knows the format by the suffix
        cache, metadata = load_prompt_cache(str(staged), return_metadata=True)
        tokens = [int(t) for t in json.loads(metadata[_TOKENS_KEY])]
        key = metadata.get(_ADAPTERS_KEY, BASE_KEY)  # the LoRA settings it was computed under
        cache = engine.kv.adopt(cache)  # a file of another -ctk is held as this server's
    except Exception:  # noqa: BLE001 - a missing or foreign file is the client's error
        raise EngineError("Unable to restore slot, no available space in KV cache or invalid "
                          "slot save file") from None
    finally:
        staged.unlink(missing_ok=True)
    engine.prefix_cache.store(tokens, cache, key)
    slot.last_tokens, slot.cache_key = tokens, key
    return {"id_slot": id_slot, "filename": filename, "n_restored": len(tokens),
            "n_read": path.stat().st_size,
            "timings": {"restore_ms": (time.perf_counter() - start) * 1e3}}


def _stage(path: Path, staged: Path) -> None:
    """The file under the name mx.load reads: a hard link, or a copy where the file system has
    none (FAT and exFAT volumes, some network mounts) or refuses it."""
    try:
        os.link(path, staged)
    except OSError:
        if not path.is_file():
            raise
        shutil.copyfile(path, staged)


def erase(engine: Engine, id_slot: int) -> dict:
    slot = _idle_slot(engine, id_slot)
    n_erased = engine.prefix_cache.discard_prefixes(slot.last_tokens, slot.cache_key)
    slot.last_tokens = []
    return {"id_slot": id_slot, "n_erased": n_erased}
