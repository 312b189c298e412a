"""A GGUF file as an mlx-lm model: scan, build, place every tensor, load.

Every tensor's type is checked before anything is loaded; what cannot be loaded right is refused
with one error naming each tensor and its type, and so is a tensor the model has no place for
or a weight the file lacks: never a silently wrong weight.
"""

from __future__ import annotations

import importlib
import logging
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from gguf import get_tensor_name_map
from mlx.utils import tree_flatten, tree_unflatten

from . import quants
from .families import Family, family_of, row_transform
from .reader import GGUFError, GGUFFile, Tensor

log = logging.getLogger("mlxray.gguf")
MiB = 1 << 20


@dataclass
class Placement:
    """Where each file tensor goes: model parameter -> tensor, and how it is represented."""

    tensors: dict[str, Tensor] = field(default_factory=dict)  # parameter -> file tensor
    quantized: dict[str, int] = field(default_factory=dict)  # module path -> bits
    dequantized: list[Tensor] = field(default_factory=list)


def build_model(file: GGUFFile) -> tuple[nn.Module, dict[str, Any]]:
    """The mlx-lm model a file holds, weights loaded, and its config."""
    family = family_of(file)
    refuse_types(file)
    config = {"model_type": family.model_type, **family.config(file)}
    arch = importlib.import_module(f"mlx_lm.models.{family.model_type}")
    model = arch.Model(arch.ModelArgs.from_dict(config))
    if "output.weight" not in file.tensors and hasattr(model, "sanitize"):
        model.sanitize({})  # the models that tie the output to the embedding when it is absent
    patch(model, family, file, config)
    placement = place(model, family, file, config)
    nn.quantize(model, class_predicate=lambda path, _: _affine(placement.quantized.get(path)))
    weights = [w for name, t in placement.tensors.items()
               for w in convert(name, t, name.removesuffix(".weight") in placement.quantized,
                                row_transform(family, config, name))]
    model.load_weights(weights, strict=True)
    model.eval()
    mx.eval(model.parameters())
    log_summary(file, placement)
    return model, config


def _affine(bits: int | None) -> dict | bool:
    return {"group_size": quants.GROUP, "bits": bits, "mode": "affine"} if bits else False


def refuse_types(file: GGUFFile) -> None:
    bad = [why for t in file.tensors.values() if (why := quants.refusal(t))]
    if bad:
        raise GGUFError(f"{file.path}: {len(bad)} tensor(s) of types mlxray cannot load exactly "
                        f"or dequantize: {', '.join(bad)}")


def place(model: nn.Module, family: Family, file: GGUFFile, config: dict) -> Placement:
    """Each model parameter's tensor (gguf-py's name map), and whether it stays quantized."""
    names = get_tensor_name_map(family.arch, config["num_hidden_layers"])
    modules = dict(tree_flatten(model.leaf_modules(), is_leaf=nn.Module.is_module))
    placement, missing = Placement(), []
    for param, _ in tree_flatten(model.parameters()):
        gguf_name = names.get_name(param, try_suffixes=(".weight", ".bias"))
        tensor = file.tensors.get(gguf_name or "")
        if tensor is None:
            missing.append(f"{param} ({gguf_name or 'no GGUF name'})")
            continue
        placement.tensors[param] = tensor
        owner = param.removesuffix(".weight")
        if tensor.type in quants.BITS and param.endswith(".weight") and hasattr(
                modules.get(owner), "to_quantized"):
            placement.quantized[owner] = quants.BITS[tensor.type]
        elif tensor.type not in quants.FLOATS:
            placement.dequantized.append(tensor)
    if missing:
        raise GGUFError(f"{file.path}: the {file.arch} model needs tensors the file does not "
                        f"have: {', '.join(missing)}")
    used = {t.name for t in placement.tensors.values()} | set(family.extra_tensors)
    unused = sorted(set(file.tensors) - used)
    if unused:
        raise GGUFError(f"{file.path}: tensors mlxray has no place for in a {file.arch} model "
                        f"(loading without them would be wrong): {', '.join(unused)}")
    return placement


def convert(name: str, t: Tensor, quantized: bool,
            rows: Callable[[np.ndarray], np.ndarray] | None) -> list[tuple[str, mx.array]]:
    """One parameter's MLX arrays: (name, array), or weight/scales/biases when quantized."""
    fix = rows or (lambda a: a)
    if quantized:
        a = quants.repack(t)
        owner = name.removesuffix(".weight")
        return [(name, mx.array(fix(a.weight))), (f"{owner}.scales", mx.array(fix(a.scales))),
                (f"{owner}.biases", mx.array(fix(a.biases)))]
    if t.type == quants.Q.BF16:
        return [(name, mx.array(fix(quants.bf16_bits(t))).view(mx.bfloat16))]
    values = np.asarray(t.data).reshape(t.shape) if t.type in quants.FLOATS else (
        quants.dequantize(t))
    return [(name, mx.array(fix(values)))]


def patch(model: nn.Module, family: Family, file: GGUFFile, config: dict) -> None:
    """The layout quirks that change modules, not weights (see families.py)."""
    if "norm_is_scale" in family.quirks:
        norms = [(path, nn.RMSNorm(m.weight.shape[0], eps=m.eps)) for path, m in
                 model.named_modules() if _scales_by_one_plus(m)]
        model.update_modules(tree_unflatten(norms))
    factors = file.tensors.get("rope_freqs.weight")
    if "rope_freqs" in family.quirks and factors is not None:
        dims = config["head_dim"]
        base = config["rope_theta"] ** (mx.arange(0, dims, 2, dtype=mx.float32) / dims)
        periods = base * mx.array(np.asarray(factors.data, np.float32))
        for layer in model.layers:
            layer.self_attn.rope = FactorRoPE(dims, periods)


def _scales_by_one_plus(module: nn.Module) -> bool:
    """Gemma's own RMSNorm class (it scales by 1 + weight), not MLX's."""
    return type(module).__name__ == "RMSNorm" and type(module) is not nn.RMSNorm


class FactorRoPE(nn.Module):
    """A rope with per-frequency factors (llama.cpp's rope_freqs: theta / factor)."""

    def __init__(self, dims: int, periods: mx.array):
        super().__init__()
        self.dims = dims
        self._freqs = periods

    def __call__(self, x: mx.array, offset: int = 0) -> mx.array:
        return mx.fast.rope(x, self.dims, traditional=False, base=None, scale=1.0,
                            offset=offset, freqs=self._freqs)


def log_summary(file: GGUFFile, placement: Placement) -> None:
    types = Counter(t.type.name for t in file.tensors.values())
    kinds = ", ".join(f"{name} x{n}" for name, n in sorted(types.items()))
    repacked = [t for name, t in placement.tensors.items()
                if name.removesuffix(".weight") in placement.quantized]
    # MLX's layout: the packed bits plus a float32 scale and bias per group of 32
    mlx_bytes = sum(t.n_elements * quants.BITS[t.type] // 8 + t.n_elements // 4
                    for t in repacked)
    log.info("GGUF %s: %s, %d tensors (%s); %d repacked as MLX affine groups of %d: %.1f MiB "
             "in memory for %.1f MiB in the file", file.path.name, file.arch, len(file.tensors),
             kinds, len(repacked), quants.GROUP, mlx_bytes / MiB,
             sum(t.n_bytes for t in repacked) / MiB)
    if placement.dequantized:
        stored = sum(t.n_bytes for t in placement.dequantized)
        loaded = sum(t.n_elements * 4 for t in placement.dequantized)
        which = ", ".join(sorted({t.type.name for t in placement.dequantized}))
        log.warning("GGUF %s: %d tensor(s) of %s dequantized to float32: %.1f MiB in memory "
                    "for %.1f MiB in the file", file.path.name, len(placement.dequantized),
                    which, loaded / MiB, stored / MiB)
