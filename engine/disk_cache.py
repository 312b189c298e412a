"""The prompt cache's disk tier (``--cache-disk DIR``, ``--cache-disk-mib N``).

Under the RAM prefix cache (engine/prefix_cache.py): an entry leaving RAM, and a long prompt's
entry as soon as it is made, is kept in a file of the folder (engine/disk_files.py); a prompt that
finds less than it could in RAM looks for the longest prefix on disk and loads it. The folder is
the index: a file appears whole (written under a temporary name, then renamed) and is never
rewritten, so any number of engines (a node's replicas, a restarted server) share it; each engine
lists the folder when it looks and reads a new file's header once. Files are evicted least
recently used first (a hit touches its file) until the folder's cache files fit the bound.

Writing happens off the engine's thread: the engine makes the arrays contiguous and evaluated,
a writer thread copies them to the file. Reading happens on it, as the prompt waits for it. A
file that cannot be read, or whose header is not this setup's, is removed; another setup's files
(another model, KV-cache type) are left alone but count against the bound; this setup's files
of another mlxray version or file format are removed.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np
from mlx.utils import tree_flatten
from mlx_lm.models.cache import can_trim_prompt_cache, load_prompt_cache, trim_prompt_cache

from .disk_files import NAME, Entry, Names, common_prefix, model_identity, prepare, read_entry

log = logging.getLogger("mlxray.engine")

EAGER_TOKENS = 1024  # an entry this long is written when it is made, not only when it leaves RAM
MIN_GAIN = 16  # fewer tokens than this beyond what RAM holds are cheaper to read again
MAX_PENDING = 8  # entries waiting for the writer; past it, more are not written
_TMP = ".tmp.safetensors"
_STALE_TMP_S = 600.0  # a temporary file this old is a dead writer's torn write


class DiskCache:
    """The folder's cache files of one setup (``names``); ``max_bytes`` None: no bound."""

    def __init__(self, folder: str, max_bytes: int | None, names: Names, kv: Any,
                 eager_tokens: int = EAGER_TOKENS):
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.max_bytes = max_bytes
        self.names = names
        self.kv = kv  # engine/kv_quant.py's KVLayout: files hold mlx-lm's own cache classes
        self.eager_tokens = eager_tokens
        self._index: dict[str, Entry] = {}
        self._pending: set[str] = set()
        self._queue: queue.Queue = queue.Queue()
        self.n_written = 0
        self.n_dropped = 0  # entries not written: the writer was behind
        self._writer = threading.Thread(target=self._run, name="mlxray-cache-disk", daemon=True)
        self._writer.start()

    # ---- the engine's thread -------------------------------------------------------------
    def lookup(self, head: list[int], key: str, n_min: int) -> tuple[list | None, int, int]:
        """The cache of the longest prefix of ``head`` on disk that beats ``n_min`` tokens (an
        exact prefix, or a longer entry that can be trimmed back to what it shares), its length,
        and the longest prefix ``head`` shares with any entry: (None, 0, n_shared) if none."""
        self._scan()
        prompt = np.asarray(head, dtype=np.int64)
        best, n_shared = None, 0
        for entry in self._index.values():
            if entry.key != key:
                continue
            n = common_prefix(entry.tokens, prompt)
            n_shared = max(n_shared, n)
            exact = n == len(entry.tokens)
            if n < n_min + MIN_GAIN or not (exact or entry.trimmable):
                continue
            rank = (n, exact, -entry.size)
            if best is None or rank > best[0]:
                best = (rank, entry, n)
        if best is None:
            return None, 0, n_shared
        cache = self._load(best[1], best[2])
        return (cache, best[2], n_shared) if cache is not None else (None, 0, n_shared)

    def put(self, tokens: list[int], cache: list[Any], key: str) -> None:
        """Have the writer keep ``cache`` under ``tokens`` (nothing if a file holds them)."""
        if not tokens:
            return
        name = self.names.name(tokens, key)
        path = self.folder / name
        if name in self._pending or path.exists():
            return
        nbytes = sum(c.nbytes for c in cache)
        if self.max_bytes is not None and nbytes > self.max_bytes:
            return
        if self._queue.qsize() >= MAX_PENDING:
            self.n_dropped += 1
            return
        arrays, metadata = prepare(self.kv.portable(cache), list(tokens), key,
                                   can_trim_prompt_cache(cache), self.names)
        self._pending.add(name)
        self._queue.put((name, arrays, metadata))

    def discard_prefixes(self, tokens: list[int], key: str) -> None:
        """Remove the files of every prefix of ``tokens`` (a slot erased)."""
        self._scan()
        prompt = np.asarray(tokens, dtype=np.int64)
        for entry in list(self._index.values()):
            if entry.key == key and common_prefix(entry.tokens, prompt) == len(entry.tokens):
                self._remove(entry.name)

    def _load(self, entry: Entry, n_tokens: int) -> list[Any] | None:
        path = self.folder / entry.name
        try:
            cache = load_prompt_cache(str(path))
            mx.eval([a for _, a in tree_flatten([c.state for c in cache])
                     if isinstance(a, mx.array)])  # read now: a torn file fails here
            cache = self.kv.adopt(cache)
            extra = len(entry.tokens) - n_tokens
            if extra and trim_prompt_cache(cache, extra) != extra:
                raise ValueError("the cache could not be trimmed back")
            os.utime(path)  # the least recently used file is evicted first
        except FileNotFoundError:  # evicted meanwhile by another engine
            self._index.pop(entry.name, None)
            return None
        except Exception as exc:  # noqa: BLE001 - any unreadable file is removed, never used
            log.warning("the disk cache file %s cannot be read (%s): removed", entry.name, exc)
            self._remove(entry.name)
            return None
        return cache

    def _scan(self) -> None:
        """The index as the folder is now: new files' headers read, vanished files dropped."""
        try:
            present = {e.name for e in os.scandir(self.folder)}
        except OSError:
            present = set()
        for name in [n for n in self._index if n not in present]:
            del self._index[name]
        for name in present:
            if name in self._index or name in self._pending:
                continue
            owned = self.names.owns(name)
            if owned is None:
                continue
            entry = read_entry(self.folder / name, self.names) if owned else None
            if entry is None:  # another build's, torn, or not what its name says
                self._remove(name)
            else:
                self._index[name] = entry

    def _remove(self, name: str) -> None:
        self._index.pop(name, None)
        (self.folder / name).unlink(missing_ok=True)

    # ---- the writer's thread ---------------------------------------------------------------
    def flush(self, timeout: float = 30.0) -> bool:
        """Wait until every entry handed to the writer is written; False on a timeout."""
        deadline = time.monotonic() + timeout
        with self._queue.all_tasks_done:
            while self._queue.unfinished_tasks:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._queue.all_tasks_done.wait(left)
        return True

    def close(self, timeout: float = 30.0) -> None:
        self.flush(timeout)
        self._queue.put(None)
        self._writer.join(timeout)

    def _run(self) -> None:
        while True:
            job = self._queue.get()
            try:
                if job is None:
                    return
                self._write(*job)
            except Exception:  # noqa: BLE001 - a full disk loses an entry, not the engine
                log.exception("the disk cache could not write %s", job[0])
            finally:
                if job is not None:
                    self._pending.discard(job[0])
                self._queue.task_done()

    def _write(self, name: str, arrays: dict, metadata: dict) -> None:
        tmp = self.folder / f".{name[:-12]}.{os.getpid()}.{threading.get_ident()}{_TMP}"
        try:
            mx.save_safetensors(str(tmp), arrays, metadata)
            os.replace(tmp, self.folder / name)
        finally:
            tmp.unlink(missing_ok=True)
        self.n_written += 1
        self._evict()

    def _evict(self) -> None:
        """Least recently used files first, of every setup, until the folder fits the bound;
        dead writers' temporary files go too."""
        files, now = [], time.time()
        for e in os.scandir(self.folder):
            try:
                st = e.stat()
            except OSError:
                continue
            if NAME.match(e.name):
                files.append((st.st_mtime_ns, st.st_size, e.name))
            elif e.name.endswith(_TMP) and now - st.st_mtime > _STALE_TMP_S:
                Path(e.path).unlink(missing_ok=True)
        if self.max_bytes is None:
            return
        total = sum(size for _, size, _ in files)
        for _, size, name in sorted(files):
            if total <= self.max_bytes:
                break
            (self.folder / name).unlink(missing_ok=True)
            total -= size


def disk_cache(loaded: Any, config: Any, kv: Any) -> DiskCache | None:
    """The engine's disk tier (``config.cache_disk``), None without one."""
    if not config.cache_disk:
        return None
    identity = model_identity(loaded.path, loaded.model, loaded.adapter, config.kv_cache_type)
    bound = None if config.cache_disk_mib < 0 else config.cache_disk_mib * 1024 * 1024
    return DiskCache(config.cache_disk, bound, Names.of(identity), kv)
