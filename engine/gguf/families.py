"""Architectures: a GGUF file's metadata as an mlx-lm model config, and the layout quirks of
llama.cpp's converter undone, so the model equals the same model loaded from its HF folder.

- llama (Llama, Mistral, ...): the converter permutes Q and K rows for GGML's rope; un-permuted
  here. Llama 3's rope scaling is stored as per-frequency factors (``rope_freqs.weight``); they
  become the rope's frequencies.
- gemma3: the converter stores norm weights as ``1 + w`` (Gemma's norm scales by ``1 + w``);
  the norms here scale by the stored value itself, which is exactly what Gemma computes.
- phi3: Q/K/V and gate/up stay fused, as in the HF model; long-rope factors are tensors
  (``rope_factors_long``/``rope_factors_short``) and become the rope scaling config.
- qwen2, qwen3: taken as they are (biases, Q/K norms).
The tensor names themselves come from gguf-py's own name map (``gguf.get_tensor_name_map``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from gguf import MODEL_ARCH

from .reader import GGUFError, GGUFFile


@dataclass(frozen=True)
class Family:
    model_type: str  # the mlx_lm.models module
    arch: MODEL_ARCH  # gguf-py's architecture (its tensor name map)
    config: Callable[[GGUFFile], dict[str, Any]]
    extra_tensors: tuple[str, ...] = ()  # file tensors a patch consumes, not model weights
    quirks: tuple[str, ...] = ()


def base_config(f: GGUFFile) -> dict[str, Any]:
    heads = f.arch_get("attention.head_count")
    kv_heads = f.arch_get("attention.head_count_kv", heads)
    if isinstance(heads, list) or isinstance(kv_heads, list):
        raise GGUFError(f"{f.path}: per-layer head counts are not supported")
    hidden = int(f.arch_get("embedding_length"))
    embed = f.tensors.get("token_embd.weight")
    if embed is None:
        raise GGUFError(f"{f.path}: no token_embd.weight tensor")
    return {
        "hidden_size": hidden,
        "num_hidden_layers": int(f.arch_get("block_count")),
        "intermediate_size": int(f.arch_get("feed_forward_length")),
        "num_attention_heads": int(heads),
        "num_key_value_heads": int(kv_heads),
        "head_dim": int(f.arch_get("attention.key_length", hidden // int(heads))),
        "rms_norm_eps": float(f.arch_get("attention.layer_norm_rms_epsilon", 1e-6)),
        "vocab_size": embed.shape[0],
        "max_position_embeddings": f.context_length,
        "rope_theta": float(f.arch_get("rope.freq_base", 10000.0)),
        "tie_word_embeddings": "output.weight" not in f.tensors,
        **rope_scaling(f),
    }


def rope_scaling(f: GGUFFile) -> dict[str, Any]:
    kind = f.arch_get("rope.scaling.type", "none")
    factor = float(f.arch_get("rope.scaling.factor", 0.0) or 0.0)
    if kind == "none" or (kind == "linear" and factor in (0.0, 1.0)):
        return {}
    if kind == "linear":
        return {"rope_scaling": {"type": "linear", "rope_type": "linear", "factor": factor}}
    raise GGUFError(f"{f.path}: rope scaling '{kind}' ({f.arch}.rope.scaling.type) is not "
                    "supported by mlxray's GGUF loader")


def whole_rope(f: GGUFFile, config: dict[str, Any]) -> None:
    rot = int(f.arch_get("rope.dimension_count", config["head_dim"]))
    if rot != config["head_dim"]:
        raise GGUFError(f"{f.path}: a partial rope ({rot} of {config['head_dim']} dimensions) "
                        f"is not supported for {f.arch}")


def no_experts(f: GGUFFile) -> None:
    if int(f.arch_get("expert_count", 0) or 0) > 0:
        raise GGUFError(f"{f.path}: mixture-of-experts {f.arch} files are not supported")


def llama_config(f: GGUFFile) -> dict[str, Any]:
    config = base_config(f)
    whole_rope(f, config)
    no_experts(f)
    config["attention_bias"] = "blk.0.attn_q.bias" in f.tensors
    config["mlp_bias"] = "blk.0.ffn_up.bias" in f.tensors
    return config


def qwen_config(f: GGUFFile) -> dict[str, Any]:
    config = base_config(f)
    whole_rope(f, config)
    no_experts(f)
    return config


def gemma3_config(f: GGUFFile) -> dict[str, Any]:
    config = base_config(f)
    whole_rope(f, config)
    # llama.cpp: window pattern 6, local rope base 10000, query scale 1/sqrt(head_dim) (the
    # 27B, 62 layers: 1/sqrt(hidden / heads))
    heads, layers = config["num_attention_heads"], config["num_hidden_layers"]
    scalar = config["hidden_size"] // heads if layers == 62 else config["head_dim"]
    window = int(f.arch_get("attention.sliding_window", 0) or 0)
    config.update(
        query_pre_attn_scalar=scalar,
        sliding_window=window or config["max_position_embeddings"],
        sliding_window_pattern=window_pattern(f) if window else 1,
        rope_local_base_freq=float(f.arch_get("rope.freq_base_swa", 10000.0)),
    )
    config.pop("tie_word_embeddings")  # gemma3_text ties when the weights have no lm_head
    return config


def window_pattern(f: GGUFFile) -> int:
    """Every Nth layer global (llama.cpp's gemma3 default: 6); a per-layer list of flags (true:
    sliding) is taken when it repeats such a pattern."""
    value = f.arch_get("attention.sliding_window_pattern", 6)
    if not isinstance(value, list):
        return int(value)
    period = value.index(False) + 1 if False in value else len(value) + 1
    expected = [(i + 1) % period != 0 for i in range(len(value))]
    if value != expected:
        raise GGUFError(f"{f.path}: sliding-window layers {value} do not repeat every Nth layer")
    return period


def phi3_config(f: GGUFFile) -> dict[str, Any]:
    config = base_config(f)
    no_experts(f)
    rot = int(f.arch_get("rope.dimension_count", config["head_dim"]))
    config["partial_rotary_factor"] = rot / config["head_dim"]
    long, short = f.tensors.get("rope_factors_long.weight"), f.tensors.get(
        "rope_factors_short.weight")
    if long is not None:
        config["rope_scaling"] = {
            "type": "longrope", "long_factor": np.asarray(long.data, np.float32).tolist(),
            "short_factor": np.asarray(short.data if short is not None else long.data,
                                       np.float32).tolist()}
        config["original_max_position_embeddings"] = int(
            f.arch_get("rope.scaling.original_context_length", f.context_length))
    return config


FAMILIES = {
    "llama": Family("llama", MODEL_ARCH.LLAMA, llama_config, ("rope_freqs.weight",),
                    ("unpermute_qk", "rope_freqs")),
    "qwen2": Family("qwen2", MODEL_ARCH.QWEN2, qwen_config),
    "qwen3": Family("qwen3", MODEL_ARCH.QWEN3, qwen_config),
    "gemma3": Family("gemma3_text", MODEL_ARCH.GEMMA3, gemma3_config, (), ("norm_is_scale",)),
    "phi3": Family("phi3", MODEL_ARCH.PHI3, phi3_config,
                   ("rope_factors_long.weight", "rope_factors_short.weight")),
}


def family_of(f: GGUFFile) -> Family:
    family = FAMILIES.get(f.arch)
    if family is None:
        raise GGUFError(f"{f.path}: architecture '{f.arch}' is not supported by mlxray's GGUF "
                        f"loader (supported: {', '.join(FAMILIES)})")
    return family


def row_transform(family: Family, config: dict[str, Any], name: str):
    """The row permutation a parameter needs, or None."""
    if "unpermute_qk" not in family.quirks:
        return None
    if ".self_attn.q_proj." in name:
        heads = config["num_attention_heads"]
    elif ".self_attn.k_proj." in name:
        heads = config["num_key_value_heads"]
    else:
        return None
    # the converter's permute(w, n_head, n_head_kv) splits each head's rows into two halves
    return lambda rows: _permute_back(rows, heads)


def _permute_back(rows: np.ndarray, heads: int) -> np.ndarray:
    """Undo LlamaModel.permute on the row axis (weights, packed quantized rows, their scales
    and biases, biases alike)."""
    shape = rows.shape
    return (rows.reshape(heads, shape[0] // heads // 2, 2, *shape[1:])
            .swapaxes(1, 2).reshape(shape))
