"""The files of the disk prompt cache (engine/disk_cache.py): their names, what identifies the
setup that made them, and their contents.

A file holds one prefix-cache entry, written as mlx-lm's ``save_prompt_cache`` writes a prompt
cache (safetensors; ``load_prompt_cache`` reads it back), with the entry's tokens, its LoRA key
and the setup's identity in the metadata. Its name is
``<setup>-<build>-<entry>-<n_tokens>.safetensors``: ``setup`` hashes the model (its path, files
and arguments, a fused adapter) and the KV-cache type, ``build`` the mlxray version and this
format, ``entry`` the LoRA key and the tokens. The name says whose a file is without opening it;
the metadata is checked against it before a file is used.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import re
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np
from mlx.utils import tree_flatten

FORMAT = 1  # this module's layout of a file; a change makes every older file stale
NAME = re.compile(r"^([0-9a-f]{16})-([0-9a-f]{8})-([0-9a-f]{20})-(\d+)\.safetensors$")
_IDENTITY = "mlxray_identity"  # no dots: the metadata keys are unflattened on load
_TOKENS = "mlxray_tokens"
_KEY = "mlxray_adapters"
_TRIMMABLE = "mlxray_trimmable"
_MAX_HEADER = 64 << 20  # a header past this is no file of ours


def _digest(text: str, size: int) -> str:
    return hashlib.blake2b(text.encode(), digest_size=size // 2).hexdigest()


def mlxray_version() -> str:
    try:
        return importlib.metadata.version("mlxray")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def model_identity(path: str, model: Any, adapter: str | None, cache_type: str) -> dict:
    """What makes two engines' KV caches interchangeable: the model's files (names, sizes, times
    of change: a replaced weight file is another model), its arguments after any overrides
    (RoPE), a fused adapter's files, the KV-cache type."""
    return {"model": path, "files": _files(path), "args": repr(getattr(model, "args", None)),
            "adapter": None if adapter is None else [adapter, _files(adapter)],
            "kv": cache_type}


def _files(path: str) -> list:
    p = Path(path)
    if not p.exists():
        return []
    found = sorted(p.iterdir()) if p.is_dir() else [p]
    return [[f.name, f.stat().st_size, f.stat().st_mtime_ns] for f in found if f.is_file()]


@dataclass(frozen=True)
class Names:
    """How one setup names its files."""

    identity: str  # canonical JSON: the setup and the build
    setup: str
    build: str

    @classmethod
    def of(cls, identity: dict) -> Names:
        setup = json.dumps(identity, sort_keys=True)
        build = json.dumps({"mlxray": mlxray_version(), "format": FORMAT})
        whole = json.dumps({"setup": identity, "build": json.loads(build)}, sort_keys=True)
        return cls(whole, _digest(setup, 16), _digest(build, 8))

    def name(self, tokens: list[int], key: str) -> str:
        entry = _digest(key + ":" + ",".join(map(str, tokens)), 20)
        return f"{self.setup}-{self.build}-{entry}-{len(tokens)}.safetensors"

    def owns(self, name: str) -> bool | None:
        """True for this setup and build's file, False for this setup's of another build (a stale
        file), None for another setup's (or no cache file at all)."""
        m = NAME.match(name)
        if m is None or m.group(1) != self.setup:
            return None
        return m.group(2) == self.build


@dataclass
class Entry:
    """A file as the index knows it (its header read once: files are never rewritten)."""

    name: str
    tokens: np.ndarray
    key: str
    trimmable: bool
    size: int


def read_entry(path: Path, names: Names) -> Entry | None:
    """The file's entry if its header is this setup's and agrees with its name; None for a file
    that is torn, foreign or not a cache file at all."""
    try:
        with path.open("rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            if n > _MAX_HEADER:
                return None
            header = json.loads(f.read(n))["__metadata__"]
        # save_prompt_cache flattens [metadata, classes, scalars]: ours are under "0."
        meta = {k[2:]: v for k, v in header.items() if k.startswith("0.")}
        size = path.stat().st_size
        if meta[_IDENTITY] != names.identity or size < 8 + n:
            return None
        tokens = [int(t) for t in json.loads(meta[_TOKENS])]
        key = meta[_KEY]
        if names.name(tokens, key) != path.name:
            return None
        return Entry(path.name, np.asarray(tokens, dtype=np.int64), key,
                     meta[_TRIMMABLE] == "1", size)
    except (OSError, ValueError, KeyError, TypeError, struct.error):
        return None


def prepare(cache: list[Any], tokens: list[int], key: str, trimmable: bool,
            names: Names) -> tuple[dict[str, mx.array], dict[str, str]]:
    """The arrays and metadata of a file, as ``save_prompt_cache`` makes them, evaluated and
    contiguous: run on the engine's thread (it owns the arrays), so that the writer thread only
    copies bytes."""
    scalars: list = [""]  # save_prompt_cache's: non-empty, or tree_flatten drops it

    def serializable(i: str, data: Any) -> mx.array:
        if isinstance(data, mx.array):
            return mx.contiguous(data)
        if isinstance(data, (int, float, bool)):
            scalars.append((i, "scalar"))
            return mx.array(data)
        if isinstance(data, str):
            scalars.append((i, "string"))
            return mx.array([ord(c) for c in data])
        if data is None:
            scalars.append((i, "none"))
            return mx.array([])
        raise ValueError(f"a cache state that cannot be written: {type(data).__name__}")

    arrays = {i: serializable(i, d) for i, d in tree_flatten([c.state for c in cache])}
    mx.eval(list(arrays.values()))
    metadata = {_IDENTITY: names.identity, _TOKENS: json.dumps(tokens), _KEY: key,
                _TRIMMABLE: "1" if trimmable else "0"}
    flat = dict(tree_flatten([metadata, [type(c).__name__ for c in cache], scalars]))
    return arrays, flat


def common_prefix(a: np.ndarray, b: np.ndarray) -> int:
    n = min(len(a), len(b))
    differ = np.flatnonzero(a[:n] != b[:n])
    return int(differ[0]) if differ.size else n
