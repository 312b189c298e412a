"""LoRA adapters trained with mlx-lm (``mlx_lm.lora``), applied per sequence in one batch.

An adapter folder holds ``adapter_config.json`` and ``adapters.safetensors``: for each adapted
Linear ``<path>.lora_a`` (in, r) and ``<path>.lora_b`` (r, out), and the config's
``lora_parameters.scale`` (mlx-lm's alpha). mlx-lm's LoRALinear computes
``linear(x) + alpha * (x @ A) @ B`` for one adapter fixed in the model. Here every adapted Linear
is wrapped once (``BatchedLoRA``) and holds the A and B of every loaded adapter side by side
(A_cat: (in, sum r), B_cat: (sum r, out)); each model call multiplies ``x @ A_cat`` by a per-row
table of column scales (the sequence's scale of the adapter owning the column, times its alpha)
before ``@ B_cat``, so sequences with different adapters, scales, or none share one batch.

The table is bound around each model call of mlx-lm's BatchGenerator (``AdaptedBatchGenerator``,
engine/batching.py): its batches know their sequences' uids in row order, and the engine assigns
each uid its adapters (``AdapterSet.assign``). MLX is lazy: the table is captured when the call
builds the graph, so binding it for the call is enough.

DoRA and full fine-tunes are not low-rank deltas: ``fuse_adapter`` folds them into a model's
weights, which is then served as a model of its own.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_unflatten

from .adapter_folder import BASE_KEY, CONFIG_FILE, WEIGHTS_FILE, AdapterError, adapter_config

# (adapter name, scale) pairs of one sequence, nonzero scales only, sorted by name
AdapterScales = tuple[tuple[str, float], ...]


@dataclass(frozen=True)
class LoraWeights:
    """One loaded LoRA adapter: its alpha and, per adapted module path, its A and B."""

    name: str
    alpha: float
    modules: dict[str, tuple[mx.array, mx.array]]


def read_lora(path: str | Path, name: str) -> LoraWeights:
    config = adapter_config(path)
    if config.get("fine_tune_type", "lora") != "lora":
        raise AdapterError(f"{path}: a {config['fine_tune_type']} adapter is fused into its own "
                           "model, not mixed in a batch")
    try:
        alpha = float(config["lora_parameters"]["scale"])
    except (KeyError, TypeError, ValueError):
        raise AdapterError(f"{Path(path) / CONFIG_FILE}: no lora_parameters.scale") from None
    weights = mx.load(str(Path(path) / WEIGHTS_FILE))
    modules: dict[str, tuple[mx.array, mx.array]] = {}
    for key, a in weights.items():
        if key.endswith(".lora_a"):
            module = key.removesuffix(".lora_a")
            b = weights.get(module + ".lora_b")
            if b is None or a.ndim != 2 or b.ndim != 2 or a.shape[1] != b.shape[0]:
                raise AdapterError(f"{path}: {module} has no matching lora_a/lora_b pair")
            modules[module] = (a, b)
    if not modules or any(k.rsplit(".", 1)[-1] not in ("lora_a", "lora_b") for k in weights):
        raise AdapterError(f"{path}: {WEIGHTS_FILE} must hold lora_a/lora_b pairs, and only them")
    return LoraWeights(name, alpha, modules)


def fuse_adapter(model: nn.Module, path: str | Path) -> None:
    """Load an adapter (DoRA or full; a LoRA works too) into ``model`` the way mlx-lm does, then
    fuse its layers into plain ones (``mlx_lm.fuse``), so it runs as fast as the base."""
    from mlx_lm.tuner.utils import load_adapters

    load_adapters(model, str(path))
    fused = [(n, m.fuse()) for n, m in model.named_modules() if hasattr(m, "fuse")]
    if fused:
        model.update_modules(tree_unflatten(fused))


@dataclass
class _Stack:
    """One wrapped Linear's adapters side by side: ``owner`` maps each column to its adapter's
    slot in the row table, ``alpha`` is that adapter's alpha per column; ``signature`` (slot,
    rank, alpha per adapter) is shared by the layers an adapter set adapts alike."""

    a: mx.array | None = None
    b: mx.array | None = None
    owner: mx.array | None = None
    alpha: mx.array | None = None
    slots: frozenset[int] = frozenset()
    signature: tuple = ()


class BatchedLoRA(nn.Module):
    """A Linear (or QuantizedLinear) plus the low-rank deltas of every loaded adapter, each row
    of the batch scaled by its own sequence's scales."""

    def __init__(self, base: nn.Module, rows: RowTable):
        super().__init__()
        self.base = base  # a child module: the model's parameter tree keeps its weights
        self.__dict__["_base"] = base  # the same, found without Module.__getattr__ (per call)
        self._rows = rows
        self._stack = _Stack()

    def restack(self, parts: list[tuple[int, float, mx.array, mx.array]]) -> None:
        """(slot, alpha, A, B) of each adapter touching this layer (on the engine's thread: MLX
        streams are per thread)."""
        if not parts:
            self._stack = _Stack()
            return
        owner = [slot for slot, _, a, _ in parts for _ in range(a.shape[1])]
        alpha = [al for _, al, a, _ in parts for _ in range(a.shape[1])]
        self._stack = _Stack(
            a=mx.concatenate([a for _, _, a, _ in parts], axis=1),
            b=mx.concatenate([b for _, _, _, b in parts], axis=0),
            owner=mx.array(owner, dtype=mx.int32),
            alpha=mx.array(alpha, dtype=mx.float32),
            slots=frozenset(slot for slot, *_ in parts),
            signature=tuple((slot, a.shape[1], al) for slot, al, a, _ in parts),
        )
        mx.eval(self._stack.a, self._stack.b, self._stack.owner, self._stack.alpha)

    def __call__(self, x: mx.array) -> mx.array:
        y = self._base(x)
        stack = self._stack
        scales = self._rows.columns(stack, x.ndim)
        if scales is None:
            return y
        xa = (x @ stack.a) * scales
        if xa.dtype == y.dtype:
            return mx.addmm(y, xa, stack.b)  # y + xa @ B in one op
        return y + (xa @ stack.b).astype(y.dtype)  # as mlx-lm: the delta in the adapter's dtype


class RowTable:
    """The scale of each loaded adapter (a column per slot) for each row of the model call
    being built; outside a call, nothing is bound and every wrapped layer is its base."""

    def __init__(self) -> None:
        self.by_uid: dict[int, dict[int, float]] = {}  # sequence -> {slot: scale}
        self.width = 0  # slots in use: the highest slot + 1
        self._scales: mx.array | None = None  # (rows, width) while a call is bound
        self._active: frozenset[int] = frozenset()
        self._columns: dict[tuple, mx.array] = {}  # per stack signature, for the bound call

    @contextmanager
    def bind(self, uids: list[int]) -> Iterator[None]:
        saved = self._scales, self._active, self._columns
        rows = [self.by_uid.get(uid, {}) for uid in uids]
        active = frozenset(slot for row in rows for slot in row)
        if active:
            table = [[row.get(slot, 0.0) for slot in range(self.width)] for row in rows]
            self._scales, self._active = mx.array(table, dtype=mx.float32), active
        else:
            self._scales, self._active = None, frozenset()
        self._columns = {}
        try:
            yield
        finally:
            self._scales, self._active, self._columns = saved

    def columns(self, stack: _Stack, ndim: int) -> mx.array | None:
        """The scales of a layer's stack, (rows, 1.., columns) for an input of ``ndim``
        dimensions; None when no row uses its adapters."""
        if self._scales is None or not (stack.slots & self._active):
            return None
        key = (stack.signature, ndim)
        scales = self._columns.get(key)
        if scales is None:
            scales = mx.take(self._scales, stack.owner, axis=1) * stack.alpha
            scales = scales.reshape(scales.shape[0], *(1,) * (ndim - 2), scales.shape[1])
            self._columns[key] = scales
        return scales


@dataclass
class AdapterSet:
    """The LoRA adapters loaded into one engine's model, and which sequence uses which."""

    model: nn.Module
    rows: RowTable = field(default_factory=RowTable)
    loaded: dict[str, LoraWeights] = field(default_factory=dict)
    slots: dict[str, int] = field(default_factory=dict)
    layers: dict[str, BatchedLoRA] = field(default_factory=dict)
    retiring: set[str] = field(default_factory=set)

    def add(self, weights: LoraWeights) -> None:
        """Load an adapter (again: replace it); its modules must be Linear layers of the model
        with matching shapes."""
        self.retiring.discard(weights.name)
        modules = dict(self.model.named_modules())
        wraps = []
        for path, (a, b) in weights.modules.items():
            layer = self.layers.get(path) or modules.get(path)
            if layer is None:
                raise AdapterError(f"adapter {weights.name}: the model has no module {path}")
            base = layer.base if isinstance(layer, BatchedLoRA) else layer
            if not isinstance(base, (nn.Linear, nn.QuantizedLinear)):
                raise AdapterError(f"adapter {weights.name}: {path} is a {type(base).__name__}; "
                                   "only Linear layers are adapted per request")
            out_dims, in_dims = base.weight.shape
            if isinstance(base, nn.QuantizedLinear):
                in_dims = in_dims * 32 // base.bits
            if a.shape[0] != in_dims or b.shape[1] != out_dims:
                raise AdapterError(f"adapter {weights.name}: {path} is {in_dims}->{out_dims}, "
                                   f"the adapter {a.shape[0]}->{b.shape[1]}")
            if path not in self.layers:
                wraps.append((path, BatchedLoRA(base, self.rows)))
        for path, wrapper in wraps:
            self.layers[path] = wrapper
        if wraps:
            self.model.update_modules(tree_unflatten(wraps))
        if weights.name not in self.slots:
            used = set(self.slots.values())
            self.slots[weights.name] = next(i for i in range(len(used) + 1) if i not in used)
        self.loaded[weights.name] = weights
        self.rows.width = max(self.slots.values()) + 1
        self._restack(weights.modules)

    def remove(self, name: str, in_use: set[str]) -> None:
        """Unload an adapter now if no sequence uses it, else once none does (``collect``)."""
        if name in self.loaded:
            self.retiring.add(name)
            self.collect(in_use)

    def collect(self, in_use: set[str]) -> None:
        for name in [n for n in self.retiring if n not in in_use]:
            self.retiring.discard(name)
            weights = self.loaded.pop(name)
            self.slots.pop(name)
            self.rows.width = max(self.slots.values(), default=-1) + 1
            self._restack(weights.modules)

    def _restack(self, paths) -> None:
        for path in paths:
            parts = [(self.slots[w.name], w.alpha, *w.modules[path])
                     for w in self.loaded.values() if path in w.modules]
            self.layers[path].restack(parts)

    def check(self, adapters: AdapterScales) -> str | None:
        """The first adapter of ``adapters`` that is not loaded (None: all are)."""
        return next((name for name, _ in adapters if name not in self.loaded), None)

    def assign(self, uid: int, adapters: AdapterScales) -> None:
        if adapters:
            self.rows.by_uid[uid] = {self.slots[name]: scale for name, scale in adapters}
            self.retiring.difference_update(name for name, _ in adapters)

    def release(self, uid: int) -> None:
        self.rows.by_uid.pop(uid, None)


def adapter_key(adapters: AdapterScales) -> str:
    """The prefix cache's key: a prefix computed under other adapter settings never matches."""
    if not adapters:
        return BASE_KEY
    return BASE_KEY + "+lora:" + ",".join(f"{name}={scale!r}" for name, scale in adapters)
